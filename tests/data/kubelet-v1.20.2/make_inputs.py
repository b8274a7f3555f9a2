#!/usr/bin/env python3
"""Writes containers.jsonl and quantities.txt: the inputs of rkubelet's reference vectors
(hand-picked cases, then pseudo-random ones from a fixed seed). The expected values come
from the kubelet's own code: see README.md."""
import json
import random

rng = random.Random(43)

QUANTITIES = """0 0.5 100m 1G 1Gi 1e3 2000m 1.5Gi 0.1m 1000 1024 1Ki 8Ki 1025Ki 1024Ki +5 -5 5. .5 . 1.G
123456789 100000000000000000000 1E 1e-3 1E3 1e+3 1.5e3 0.0000000001 -0.0000000001 1n 1u 999m
1001m 64Mi 128974848 129e6 123Mi 1.1 1.000 05 00 -0 7Ei 9Ei 9223372036854775807Ki 1Ei 0.5Ki
1023 1023.5 2048 3Gi 1.25 1e30 12e-10 1000000k 0.001 1Pi 1P 1T 1Ti 2.5Mi 0.25Gi 10Gi 100Mi
0.000000001 1.0000000001 18446744073709551616 1234567890123456789 12345678901234567890
-1Ki -1024 -0.5 +1Ki +0.5 1e0 1e1 1e2 1e-1 1e-9 1e-10 1e18 1e19 1.5e-3
0.00000000000000000000 1x 1i 1e 1Kii e3 -- 1.2.3""".split()


def quantity():
    sign = rng.choice(["", "", "", "-", "+"])
    whole = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 1, 1, 2, 3, 4, 6, 9, 12, 17, 19, 21])))
    frac = rng.choice(["", "", "."]) if rng.random() < 0.5 else "." + "".join(
        rng.choice("0123456789") for _ in range(rng.choice([1, 2, 3, 4, 9, 10, 12])))
    if not whole and frac in ("", "."):
        whole = str(rng.randint(1, 9))
    suffix = rng.choice(["", "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi",
                         "Ti", "Pi", "Ei", "e3", "e-2", "E5", "e+4", "e0", "e-9", "e21", "e-12"])
    return sign + whole + frac + suffix


for _ in range(700):
    QUANTITIES.append(quantity())

with open("quantities.txt", "w") as f:
    for q in QUANTITIES:
        f.write(q + "\n")

HAND = [
    # The upstream unit test's container (pkg/kubelet/container/container_hash_test.go).
    {"name": "test_container", "image": "foo/image:v1", "command": ["/bin/testcmd"],
     "args": ["/bin/sh", "-c", "echo abc"], "ports": [{"containerPort": 8001}],
     "env": [{"name": "ENV_FOO", "value": "bar"},
             {"name": "ENV_BAR", "valueFrom": {"secretKeyRef": {"name": "foo", "key": "bar", "optional": True}}}],
     "resources": {"limits": {"foo": "1G"}, "requests": {"foo": "500M"}}},
    {"name": "c"},
    {"name": ""},
    {"name": "nginx", "image": "nginx", "resources": {}, "terminationMessagePath": "/dev/termination-log",
     "terminationMessagePolicy": "File", "imagePullPolicy": "Always"},
    {"name": "html", "image": "busybox", "env": [
        {"name": "A", "value": "<a href=\"x\">&amp;</a>"},
        {"name": "B", "value": "tab\there\nnew line\r\u0001\u001f\u007f \\ back"},
        {"name": "C", "value": "line\u2028sep\u2029para é ü 日本 🚀"},
        {"name": "D", "value": ""},
        {"name": "E"}]},
    {"name": "probes", "image": "busybox",
     "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP",
                                   "httpHeaders": [{"name": "X-A", "value": "<b>"}, {"name": "X-B", "value": ""}]},
                       "initialDelaySeconds": 3, "timeoutSeconds": 1, "periodSeconds": 10,
                       "successThreshold": 1, "failureThreshold": 3},
     "readinessProbe": {"tcpSocket": {"port": "http", "host": "127.0.0.1"}, "periodSeconds": 2},
     "startupProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "failureThreshold": 30, "periodSeconds": 1}},
    {"name": "probe-zero", "readinessProbe": {"httpGet": {"port": 0}, "initialDelaySeconds": 0}},
    {"name": "probe-empty", "readinessProbe": {}},
    {"name": "ports", "ports": [
        {"name": "http", "containerPort": 80, "protocol": "TCP"},
        {"containerPort": 53, "protocol": "UDP", "hostPort": 5353, "hostIP": "198.18.0.1"},
        {"containerPort": 0},
        {"name": "sctp", "containerPort": 9999, "protocol": "SCTP"}]},
    {"name": "sc", "securityContext": {
        "capabilities": {"add": ["NET_ADMIN", "SYS_TIME"], "drop": ["ALL"]}, "privileged": False,
        "seLinuxOptions": {"user": "u", "role": "r", "type": "t", "level": "s0:c1"},
        "windowsOptions": {"gmsaCredentialSpecName": "n", "gmsaCredentialSpec": "{}", "runAsUserName": "ContainerUser"},
        "runAsUser": 0, "runAsGroup": 3000, "runAsNonRoot": False, "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False, "procMount": "Default",
        "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/audit.json"}}},
    {"name": "sc-empty", "securityContext": {}},
    {"name": "sc-caps-empty", "securityContext": {"capabilities": {}, "seLinuxOptions": {}, "seccompProfile": {"type": "RuntimeDefault"}}},
    {"name": "mounts", "volumeMounts": [
        {"name": "data", "mountPath": "/data"},
        {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True, "subPath": "app.conf"},
        {"name": "logs", "mountPath": "/logs", "subPathExpr": "$(POD_NAME)", "mountPropagation": "HostToContainer"},
        {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": False}],
     "volumeDevices": [{"name": "blk", "devicePath": "/dev/xvda"}]},
    {"name": "envfrom", "envFrom": [
        {"configMapRef": {"name": "cm"}},
        {"prefix": "S_", "secretRef": {"name": "sec", "optional": True}},
        {"configMapRef": {"name": "cm2", "optional": False}, "prefix": ""}]},
    {"name": "envsrc", "env": [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}}},
        {"name": "MEM0", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "0"}}},
        {"name": "DIV", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
        {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k", "optional": True}}},
        {"name": "SEC", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    {"name": "hooks", "lifecycle": {
        "postStart": {"exec": {"command": ["sh", "-c", "echo hi > /tmp/x"]}},
        "preStop": {"httpGet": {"path": "/shutdown?a=1&b=2", "port": "admin", "host": "localhost", "scheme": "HTTPS"}}}},
    {"name": "hooks-tcp", "lifecycle": {"preStop": {"tcpSocket": {"port": 9000}}}},
    {"name": "lifecycle-empty", "lifecycle": {}},
    {"name": "tty", "stdin": True, "stdinOnce": True, "tty": True, "workingDir": "/work",
     "terminationMessagePath": "/tmp/msg", "terminationMessagePolicy": "FallbackToLogsOnError",
     "imagePullPolicy": "IfNotPresent"},
    {"name": "false-bools", "stdin": False, "stdinOnce": False, "tty": False},
    {"name": "empty-lists", "command": [], "args": [], "ports": [], "envFrom": [], "env": [],
     "volumeMounts": [], "volumeDevices": [], "resources": {"limits": {}, "requests": {}}},
    {"name": "null-lists", "command": None, "args": None, "env": None, "securityContext": None,
     "resources": None, "lifecycle": None},
    {"name": "args-blank", "command": [""], "args": ["", " ", "$(VAR)", "$$(ESC)"]},
    {"name": "res", "resources": {
        "limits": {"cpu": "0.5", "memory": "1.5Gi", "ephemeral-storage": "1G", "hugepages-2Mi": "4Mi",
                   "example.com/dev": "2", "nvidia.com/gpu": "1"},
        "requests": {"cpu": "100m", "memory": "1e3", "ephemeral-storage": "2000m"}}},
    {"name": "res-odd", "resources": {
        "limits": {"cpu": "0.1m", "memory": "+5", "a": "1024Ki", "b": "1025Ki", "c": "8Ki", "d": "1.000",
                   "e": "100000000000000000000", "f": "0", "g": "1e-10", "h": "-1"},
        "requests": {"cpu": "1001m", "memory": "129e6"}}},
    # Fields that came after v1.20: the kubelet v1.20.2 does not know them.
    {"name": "newer", "image": "busybox", "restartPolicy": "Always",
     "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
     "resources": {"claims": [{"name": "gpu"}], "limits": {"cpu": "1"}},
     "readinessProbe": {"grpc": {"port": 9090, "service": "x"}, "terminationGracePeriodSeconds": 5},
     "livenessProbe": {"httpGet": {"port": 80}, "terminationGracePeriodSeconds": 10},
     "lifecycle": {"preStop": {"sleep": {"seconds": 5}}, "stopSignal": "SIGUSR1"},
     "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}, "windowsOptions": {"hostProcess": False}},
     "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": True, "recursiveReadOnly": "Enabled"}]},
]


def maybe(p):
    return rng.random() < p


def word(n=6):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz-0123456789<>&\"\\ é") for _ in range(rng.randint(0, n)))


def handler():
    kind = rng.choice(["exec", "httpGet", "tcpSocket"])
    if kind == "exec":
        return {"exec": {"command": [word() for _ in range(rng.randint(0, 3))]}}
    if kind == "httpGet":
        h = {"port": rng.choice([80, 8080, "http", 0])}
        for k, v in (("path", "/" + word()), ("host", word()), ("scheme", rng.choice(["HTTP", "HTTPS"]))):
            if maybe(0.5):
                h[k] = v
        if maybe(0.3):
            h["httpHeaders"] = [{"name": word(), "value": word()} for _ in range(rng.randint(0, 2))]
        return {"httpGet": h}
    t = {"port": rng.choice([22, "ssh"])}
    if maybe(0.3):
        t["host"] = word()
    return {"tcpSocket": t}


def probe():
    p = handler()
    for k in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold"):
        if maybe(0.5):
            p[k] = rng.choice([0, 1, 3, 10, 2147483647])
    return p


def random_container(i):
    c = {"name": f"c{i}"}
    if maybe(0.9):
        c["image"] = rng.choice(["busybox", "nginx:1.25", "registry.local:5000/app@sha256:" + "ab" * 32])
    for k in ("command", "args"):
        if maybe(0.4):
            c[k] = [word(10) for _ in range(rng.randint(0, 3))]
    if maybe(0.3):
        c["workingDir"] = "/" + word()
    if maybe(0.4):
        c["ports"] = [dict(containerPort=rng.randint(0, 65535),
                           **({"protocol": rng.choice(["TCP", "UDP"])} if maybe(0.7) else {}),
                           **({"name": word()} if maybe(0.5) else {}),
                           **({"hostPort": rng.randint(1, 65535)} if maybe(0.2) else {})) for _ in range(rng.randint(0, 3))]
    if maybe(0.5):
        c["env"] = [{"name": word(), "value": word(12)} if maybe(0.7) else
                    {"name": word(), "valueFrom": {"fieldRef": {"fieldPath": "metadata.name", "apiVersion": "v1"}}}
                    for _ in range(rng.randint(0, 4))]
    if maybe(0.7):
        r = {}
        for k in ("limits", "requests"):
            if maybe(0.6):
                r[k] = {rng.choice(["cpu", "memory", "ephemeral-storage", "x.io/y"]): rng.choice(QUANTITIES[:60])
                        for _ in range(rng.randint(0, 3))}
        # Only quantities Go parses.
        for k in list(r):
            r[k] = {n: q for n, q in r[k].items() if q not in ("1x", "1i", "1e", "1Kii", "e3", "--", "1.2.3", ".")}
        c["resources"] = r
    if maybe(0.4):
        c["volumeMounts"] = [dict(name=word(), mountPath="/" + word(),
                                  **({"readOnly": rng.choice([True, False])} if maybe(0.5) else {}),
                                  **({"subPath": word()} if maybe(0.3) else {})) for _ in range(rng.randint(0, 3))]
    for k in ("livenessProbe", "readinessProbe", "startupProbe"):
        if maybe(0.3):
            c[k] = probe()
    if maybe(0.2):
        c["lifecycle"] = {k: handler() for k in ("postStart", "preStop") if maybe(0.6)}
    if maybe(0.5):
        c["terminationMessagePath"] = rng.choice(["/dev/termination-log", "/tmp/x"])
        c["terminationMessagePolicy"] = rng.choice(["File", "FallbackToLogsOnError"])
        c["imagePullPolicy"] = rng.choice(["Always", "IfNotPresent", "Never"])
    if maybe(0.3):
        sc = {}
        for k, v in (("runAsUser", rng.choice([0, 1000])), ("runAsNonRoot", rng.choice([True, False])),
                     ("privileged", rng.choice([True, False])), ("readOnlyRootFilesystem", True),
                     ("capabilities", {"drop": ["ALL"]})):
            if maybe(0.4):
                sc[k] = v
        c["securityContext"] = sc
    for k in ("stdin", "tty"):
        if maybe(0.1):
            c[k] = rng.choice([True, False])
    return c


with open("containers.jsonl", "w") as f:
    for c in HAND + [random_container(i) for i in range(150)]:
        f.write(json.dumps(c, ensure_ascii=False, separators=(",", ":")) + "\n")
