package main

import (
	"encoding/json"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
)

func schema() {
	v1Types := map[string]typeInfo{}
	walk(reflect.TypeOf(v1.Container{}), v1Types, nil)
	byName := map[string]reflect.Type{}
	var collect func(t reflect.Type)
	collect = func(t reflect.Type) {
		if _, seen := byName[t.String()]; seen {
			return
		}
		byName[t.String()] = t
		switch t.Kind() {
		case reflect.Ptr, reflect.Slice:
			collect(t.Elem())
		case reflect.Map:
			collect(t.Key())
			collect(t.Elem())
		case reflect.Struct:
			for i := 0; i < t.NumField(); i++ {
				collect(t.Field(i).Type)
			}
		}
	}
	collect(reflect.TypeOf(v1.Pod{}))
	pair := func(t reflect.Type) reflect.Type {
		name := t.String()
		if strings.HasPrefix(name, "core.") {
			name = "v1." + strings.TrimPrefix(name, "core.")
		}
		return byName[name]
	}
	coreTypes := map[string]typeInfo{}
	walk(reflect.TypeOf(&api.Pod{}), coreTypes, pair)
	// Convert_v1_PodSpec_To_core_PodSpec moves the pod's host namespace fields into
	// its security context: the JSON names they have in the v1 PodSpec.
	moved := map[string]string{"HostNetwork": "hostNetwork", "HostPID": "hostPID", "HostIPC": "hostIPC", "ShareProcessNamespace": "shareProcessNamespace"}
	for name, info := range coreTypes {
		for i, f := range info.Fields {
			if f.V1 == nil {
				j, ok := moved[f.Name]
				if !ok || name != "core.PodSecurityContext" {
					panic("no v1 field for " + name + "." + f.Name)
				}
				info.Fields[i].V1 = &j
			}
		}
	}
	out := json.NewEncoder(os.Stdout)
	out.Encode(map[string]interface{}{"v1": v1Types, "core": coreTypes})
}

// staticPods runs the kubelet's file source over dir and prints each pod it makes: its
// UID, the defaulted v1 pod, and the hash of each container.
func staticPods(dir, node string) {
	updates := make(chan interface{}, 1)
	config.NewSourceFile(dir, types.NodeName(node), time.Hour, updates)
	u := (<-updates).(kubetypes.PodUpdate)
	sort.Slice(u.Pods, func(i, j int) bool { return u.Pods[i].Name < u.Pods[j].Name })
	out := json.NewEncoder(os.Stdout)
	for _, pod := range u.Pods {
		hashes := map[string]string{}
		for i := range pod.Spec.InitContainers {
			c := &pod.Spec.InitContainers[i]
			hashes[c.Name] = strconv.FormatUint(kubecontainer.HashContainer(c), 16)
		}
		for i := range pod.Spec.Containers {
			c := &pod.Spec.Containers[i]
			hashes[c.Name] = strconv.FormatUint(kubecontainer.HashContainer(c), 16)
		}
		delete(pod.Annotations, "kubernetes.io/config.seen")
		out.Encode(map[string]interface{}{"uid": pod.UID, "source": pod.Annotations[kubetypes.ConfigSourceAnnotationKey], "hashes": hashes, "pod": pod})
	}
}
