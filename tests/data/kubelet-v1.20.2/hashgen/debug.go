package main

import (
	"fmt"
	"io/ioutil"
	"os"

	"github.com/davecgh/go-spew/spew"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
)

// podSpew prints go-spew's %#v of a manifest decoded as the kubelet's file source decodes
// it (for debugging a UID that differs; the UIDs of the vectors come from the file source).
func podSpew(path string) {
	data, err := ioutil.ReadFile(path)
	if err != nil {
		fail(err)
	}
	json, err := utilyaml.ToJSON(data)
	if err != nil {
		fail(err)
	}
	obj, err := runtime.Decode(legacyscheme.Codecs.UniversalDecoder(), json)
	if err != nil {
		fail(err)
	}
	printer := spew.ConfigState{Indent: " ", SortKeys: true, DisableMethods: true, SpewKeys: true}
	fmt.Fprintln(os.Stdout, printer.Sprintf("%#v", obj))
}
