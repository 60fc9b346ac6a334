package broker

import (
	"encoding/json"
	"reflect"
	"testing"
)

// The hand-written codec of K's body agrees with encoding/json: what it
// decodes, encoding/json decodes the same; what it encodes is
// json.Marshal's bytes.
var rwBodySamples = []string{
	`{"Holders":{}}`,
	`{"Holders":{},"Seq":1}`,
	`{"Holders":{"6d8c4ca1-4016-506e-b0ae-a07d79743f91":"r"},"Seq":18446744073709551615}`,
	`{"Holders":{"a":"r","b":"w"},"Seq":42}`,
	`{"Holders":{"a":"r","a":"w"},"Seq":3}`,
	`{"Holders":{"a":"x"},"Seq":3}`,
	`{"Holders":{"a\u0041":"r"},"Seq":3}`,
	`{"Holders":{"a":"r"},"Seq":18446744073709551616}`,
	`{"Holders":{"a":"r"},"Seq":01}`,
	`{"Holders":{"a":"r"},"Seq":-1}`,
	`{"Holders":{"a":"r"},"Seq":1.5}`,
	`{"Holders":{"a":"r"} ,"Seq":1}`,
	`{"Holders":{"":"r"}}`,
	`{"Holders":null,"Seq":2}`,
	`{"holders":{"a":"w"}}`,
	`{"Holders":{"a":"r",}}`,
	`{"Holders":{"a":"r"},"Seq":}`,
	`{"Holders":{"a":"r"}`,
	`{"Holders":{"a":"r"}}x`,
	`{"Holders":{"a":"r"},"Seq":7}}`,
	`{"Holders":{"a":"r""`,
	`{"Holders":{"a`,
	`{"Holders":{`,
	``,
	`[]`,
}

func FuzzRWBody(f *testing.F) {
	for _, s := range rwBodySamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) { checkRWBody(t, v) })
}

func TestRWBodyCodec(t *testing.T) {
	for _, s := range rwBodySamples {
		checkRWBody(t, []byte(s))
	}
	for _, b := range []rwBody{
		{Holders: map[string]string{}},
		{Holders: map[string]string{}, Seq: 9},
		{Holders: map[string]string{"b": "w", "a": "r", "C-9": "r"}, Seq: 1 << 63},
		{Holders: map[string]string{"a\"b": "r"}, Seq: 2},
		{Holders: map[string]string{"é": "w"}},
		{Holders: map[string]string{"a": "rw"}, Seq: 1},
		{Holders: map[string]string{"": "r"}, Seq: 1},
		{},
	} {
		got, err := encodeRWBody(b)
		want, werr := json.Marshal(b)
		if err != nil || werr != nil || string(got) != string(want) {
			t.Errorf("encodeRWBody(%+v) = %s, %v; json.Marshal: %s, %v", b, got, err, want, werr)
		}
	}
}

func checkRWBody(t *testing.T, v []byte) {
	var fast rwBody
	if !fastDecodeRWBody(v, &fast) {
		var b rwBody
		err := decodeRWBody(v, &b)
		var want rwBody
		werr := json.Unmarshal(v, &want)
		if (err == nil) != (werr == nil) || (err == nil && !reflect.DeepEqual(b, want)) {
			t.Errorf("decodeRWBody(%q) = %+v, %v; json.Unmarshal: %+v, %v", v, b, err, want, werr)
		}
		return
	}
	var want rwBody
	if err := json.Unmarshal(v, &want); err != nil {
		t.Fatalf("fast path decoded %q, which json.Unmarshal refuses: %v", v, err)
	}
	if want.Holders == nil {
		want.Holders = map[string]string{}
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("fast path decoded %q as %+v; json.Unmarshal: %+v", v, fast, want)
	}
	out, err := encodeRWBody(fast)
	if err != nil {
		t.Fatal(err)
	}
	var back rwBody
	if !fastDecodeRWBody(out, &back) || !reflect.DeepEqual(back, fast) {
		t.Fatalf("encodeRWBody(%+v) = %s, which does not decode back", fast, out)
	}
}
