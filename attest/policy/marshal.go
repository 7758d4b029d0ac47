package policy

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Marshal renders a policy as the YAML an operator writes: the fields
// set, in the order of the policy's types (a nil pointer, an empty list
// or map, a zero value are left out; a pointer to a zero value is kept:
// serve.public: false). Parse reads it back to the same policy.
func Marshal(p *Policy) ([]byte, error) {
	n, _ := node(reflect.ValueOf(*p))
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// node renders v as YAML: struct fields by their yaml tags, in order,
// only those set (a nil pointer, an empty list or map, a zero value are
// left out; a pointer to a zero value is kept: serve.public: false).
func node(v reflect.Value) (*yaml.Node, bool) {
	if d, ok := v.Interface().(Duration); ok {
		if d.Duration == 0 {
			return nil, false
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Value: d.String()}, true
	}
	if tm, ok := v.Interface().(time.Time); ok {
		return &yaml.Node{Kind: yaml.ScalarNode, Value: tm.UTC().Format(time.RFC3339)}, !tm.IsZero()
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil, false
		}
		n, ok := node(v.Elem())
		if !ok { // a pointer to a zero value: say it
			n = &yaml.Node{}
			if err := n.Encode(v.Elem().Interface()); err != nil {
				panic(err)
			}
		}
		return n, true
	case reflect.Struct:
		m := &yaml.Node{Kind: yaml.MappingNode}
		for i := 0; i < v.NumField(); i++ {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			if c, ok := node(v.Field(i)); ok {
				m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, c)
			}
		}
		return m, len(m.Content) > 0
	case reflect.Map:
		if v.Len() == 0 {
			return nil, false
		}
		m := &yaml.Node{Kind: yaml.MappingNode}
		keys := v.MapKeys()
		sortKeys(keys)
		for _, k := range keys {
			c, ok := node(v.MapIndex(k))
			if !ok {
				c = &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle} // a pool with nothing set: {}
			}
			m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k.String()}, c)
		}
		return m, true
	case reflect.Slice:
		if v.Len() == 0 {
			return nil, false
		}
		s := &yaml.Node{Kind: yaml.SequenceNode}
		for i := 0; i < v.Len(); i++ {
			c, ok := node(v.Index(i))
			if !ok {
				c = &yaml.Node{}
				if err := c.Encode(v.Index(i).Interface()); err != nil {
					panic(err)
				}
			}
			s.Content = append(s.Content, c)
		}
		return s, true
	}
	if v.IsZero() {
		return nil, false
	}
	n := &yaml.Node{}
	if err := n.Encode(v.Interface()); err != nil {
		panic(err)
	}
	return n, true
}

func sortKeys(keys []reflect.Value) {
	slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
}

// parseTime reads an RFC 3339 time, or a date (midnight UTC).
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Parse(time.DateOnly, s)
}
