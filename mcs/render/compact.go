package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// dropEmptyObjects removes every object member whose value is an empty
// object — after removing those inside it — keeping the order of
// everything else. encoding/json cannot omit an empty struct (the typed
// Ignition configs have many: "passwd":{}, "systemd":{}, "security":{"tls":{}}),
// and the OpenShift MCS, whose encoder omits them, serves none; neither does
// Ignition need them. Array elements are kept as they are.
func dropEmptyObjects(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(b))
	if err := compactValue(dec, &out); err != nil {
		return nil, fmt.Errorf("render: compact JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("render: compact JSON: trailing data")
	}
	return out.Bytes(), nil
}

// compactValue copies one value from dec to out.
func compactValue(dec *json.Decoder, out *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return compactObject(dec, out)
		case '[':
			out.WriteByte('[')
			for n := 0; dec.More(); n++ {
				if n > 0 {
					out.WriteByte(',')
				}
				if err := compactValue(dec, out); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil { // ]
				return err
			}
			out.WriteByte(']')
			return nil
		}
		return fmt.Errorf("unexpected %v", t)
	default:
		v, err := json.Marshal(t)
		if err != nil {
			return err
		}
		out.Write(v)
		return nil
	}
}

// compactObject copies an object whose '{' was read, leaving out members
// whose value compacts to {}.
func compactObject(dec *json.Decoder, out *bytes.Buffer) error {
	out.WriteByte('{')
	n := 0
	var val bytes.Buffer
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		val.Reset()
		if err := compactValue(dec, &val); err != nil {
			return err
		}
		if bytes.Equal(val.Bytes(), []byte("{}")) {
			continue
		}
		if n > 0 {
			out.WriteByte(',')
		}
		k, err := json.Marshal(key)
		if err != nil {
			return err
		}
		out.Write(k)
		out.WriteByte(':')
		out.Write(val.Bytes())
		n++
	}
	if _, err := dec.Token(); err != nil { // }
		return err
	}
	out.WriteByte('}')
	return nil
}
