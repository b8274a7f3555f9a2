# rkubelet as an image. Built by `scripts/image.sh build` (buildah, no registry: BASE is
# a Debian image made locally; see docs/packaging.md). rkubelet itself is built on the
# host (target/release/rkubelet) and copied in: the base is Debian with glibc, as a
# kind node is.
#
# Two stages, two uses:
#   node   BASE plus what a node needs to run rkubelet as its kubelet: the binary, the
#          kubelet.service unit and kubeadm-style drop-in (ExecStart `rkubelet run` with
#          kubeadm's flags, files and variables), and rkubelet's CNI configuration. Its
#          entry point stays BASE's, so with BASE a kind node image
#          (`--build-arg BASE=<kind node image> --target node`) it is that node image
#          with rkubelet in place of the kubelet.
#   agent  (the default) `node` with rkubelet as its entry point, for a node that runs its
#          agent as a privileged container in the host's namespaces:
#            podman run --privileged --pid=host --network=host --cgroupns=host \
#              -v /sys/fs/cgroup:/sys/fs/cgroup -v /run/containerd:/run/containerd \
#              -v /var/lib/kubelet:/var/lib/kubelet:rshared \
#              -v /var/log/pods:/var/log/pods -v /etc/cni/net.d:/etc/cni/net.d \
#              -v /opt/cni/bin:/opt/cni/bin -v /etc/kubernetes:/etc/kubernetes \
#              localhost/rkubelet:0.1.0 run --kubeconfig /etc/kubernetes/kubelet.conf \
#              --network-owner=runtime ...
#          The host's cgroup hierarchies whole (podman mounts only the container's own);
#          every path at its own path, as the host's containerd reads them; the root dir a
#          shared mount on the host (`mount --bind D D && mount --make-shared D`), so the
#          pods' tmpfs volumes the agent mounts reach containerd; pod networking by the
#          runtime (the agent's thin CNI plugin would be a path in the image).
#          (tests/kind_node.rs runs it so on the local cluster.)
ARG BASE=localhost/rkubelet-base:bookworm

FROM ${BASE} AS node
COPY target/release/rkubelet /usr/bin/rkubelet
COPY packaging/systemd/kubelet.service /lib/systemd/system/kubelet.service
COPY packaging/systemd/10-kubeadm.conf /etc/systemd/system/kubelet.service.d/10-kubeadm.conf
COPY cni-config/10-rkubelet.conflist /etc/rkubelet/cni/net.d/10-rkubelet.conflist
RUN systemctl enable kubelet.service

FROM node AS agent
ENTRYPOINT ["/usr/bin/rkubelet"]
CMD ["--help"]
