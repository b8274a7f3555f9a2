package main

import (
	"reflect"
	"strings"
)

// typeInfo is one Go type as rkubelet's tables need it: reflect's name (what go-spew
// prints), its kind, and for structs the fields in declaration order.
type typeInfo struct {
	Kind   string      `json:"kind"`
	Elem   string      `json:"elem,omitempty"`
	Key    string      `json:"key,omitempty"`
	Fields []fieldInfo `json:"fields,omitempty"`
}

type fieldInfo struct {
	Name      string `json:"name"`
	Type      string `json:"type"`
	JSON      string `json:"json,omitempty"`
	OmitEmpty bool   `json:"omitempty,omitempty"`
	Inline    bool   `json:"inline,omitempty"`
	// For internal (core) types: the JSON name of the v1 field of the same Go name in
	// the v1 struct of the same name, "" when inline there, absent when there is none.
	V1 *string `json:"v1,omitempty"`
}

// opaque types: rkubelet renders them itself.
var opaque = map[string]bool{"resource.Quantity": true, "v1.Time": true, "v1.MicroTime": true, "intstr.IntOrString": true}

func jsonTag(f reflect.StructField) (name string, omitempty, inline bool) {
	tag := f.Tag.Get("json")
	parts := strings.Split(tag, ",")
	name = parts[0]
	for _, p := range parts[1:] {
		if p == "omitempty" {
			omitempty = true
		}
		if p == "inline" {
			inline = true
		}
	}
	if name == "" && f.Anonymous {
		inline = true
	}
	return
}

// walk records t and every type reachable from it; pair gives, for a struct type name
// (internal), the v1 struct to take JSON names from.
func walk(t reflect.Type, out map[string]typeInfo, pair func(reflect.Type) reflect.Type) {
	name := t.String()
	if _, seen := out[name]; seen {
		return
	}
	if opaque[name] {
		out[name] = typeInfo{Kind: "opaque"}
		return
	}
	switch t.Kind() {
	case reflect.String:
		out[name] = typeInfo{Kind: "string"}
	case reflect.Bool:
		out[name] = typeInfo{Kind: "bool"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		out[name] = typeInfo{Kind: "int"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		out[name] = typeInfo{Kind: "uint"}
	case reflect.Ptr:
		out[name] = typeInfo{Kind: "ptr", Elem: t.Elem().String()}
		walk(t.Elem(), out, pair)
	case reflect.Slice:
		out[name] = typeInfo{Kind: "slice", Elem: t.Elem().String()}
		walk(t.Elem(), out, pair)
	case reflect.Map:
		out[name] = typeInfo{Kind: "map", Key: t.Key().String(), Elem: t.Elem().String()}
		walk(t.Key(), out, pair)
		walk(t.Elem(), out, pair)
	case reflect.Struct:
		info := typeInfo{Kind: "struct"}
		out[name] = info
		var v1 reflect.Type
		if pair != nil {
			v1 = pair(t)
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			fi := fieldInfo{Name: f.Name, Type: f.Type.String()}
			if pair == nil {
				fi.JSON, fi.OmitEmpty, fi.Inline = jsonTag(f)
			} else if v1 != nil {
				if vf, ok := v1.FieldByName(f.Name); ok && len(vf.Index) == 1 {
					j, _, inl := jsonTag(vf)
					if inl {
						j = ""
					}
					fi.V1 = &j
				}
			}
			info.Fields = append(info.Fields, fi)
			walk(f.Type, out, pair)
		}
		out[name] = info
	default:
		panic("unhandled kind " + t.Kind().String() + " of " + name)
	}
}
