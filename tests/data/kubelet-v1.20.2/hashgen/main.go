// hashgen prints the kubelet v1.20.2's own values for rkubelet's reference vectors.
// It calls the vendored kubelet code; it reimplements nothing.
//
//	hashgen hash      < containers.jsonl  # one v1.Container JSON per line
//	hashgen quantity  < quantities.txt    # one quantity string per line
//	hashgen schema                        # the v1 and internal Pod types' layout
//	hashgen staticpod DIR NODE            # the kubelet's file source over DIR
//	hashgen podspew FILE                  # go-spew of a manifest decoded as the file source does
//
// hash prints, per line, {"hash": HashContainer as the kubelet's label writes it,
// "json": the json.Marshal bytes it hashes, "preStop" and "ports": the JSON of its
// preStop hook and ports annotations}; the container is also sent through the
// protobuf form the kubelet receives from the API server, and the two hashes must agree.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/davecgh/go-spew/spew"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

func main() {
	switch os.Args[1] {
	case "schema":
		schema()
		return
	case "podspew":
		podSpew(os.Args[2])
		return
	case "staticpod":
		staticPods(os.Args[2], os.Args[3])
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		line := in.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		switch os.Args[1] {
		case "hash":
			var c v1.Container
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				fail(err)
			}
			wire, err := c.Marshal()
			if err != nil {
				fail(err)
			}
			var fromWire v1.Container
			if err := fromWire.Unmarshal(wire); err != nil {
				fail(err)
			}
			h := kubecontainer.HashContainer(&c)
			if h != kubecontainer.HashContainer(&fromWire) {
				fail(fmt.Errorf("JSON and protobuf forms hash apart: %s", line))
			}
			j, _ := json.Marshal(&c)
			line := map[string]string{"hash": strconv.FormatUint(h, 16), "json": string(j)}
			// The annotations newContainerAnnotations writes with json.Marshal.
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
				p, _ := json.Marshal(c.Lifecycle.PreStop)
				line["preStop"] = string(p)
			}
			if len(c.Ports) > 0 {
				p, _ := json.Marshal(c.Ports)
				line["ports"] = string(p)
			}
			out.Encode(line)
		case "quantity":
			q, err := resource.ParseQuantity(strings.TrimSpace(line))
			if err != nil {
				out.Encode(map[string]string{"in": line, "error": err.Error()})
				continue
			}
			var viaJSON resource.Quantity
			if err := json.Unmarshal([]byte(strconv.Quote(line)), &viaJSON); err != nil {
				fail(err)
			}
			j, _ := json.Marshal(viaJSON)
			printer := spew.ConfigState{Indent: " ", SortKeys: true, DisableMethods: true, SpewKeys: true}
			parsed := printer.Sprintf("%#v", viaJSON)
			rounded := viaJSON.DeepCopy()
			rounded.RoundUp(-3)
			r, _ := json.Marshal(rounded)
			out.Encode(map[string]string{"in": line, "canonical": q.String(), "json": string(j), "spew": parsed,
				"milli_json": string(r), "milli_spew": printer.Sprintf("%#v", rounded)})
		default:
			fail(fmt.Errorf("unknown mode %q", os.Args[1]))
		}
	}
	if err := in.Err(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hashgen:", err)
	os.Exit(1)
}
