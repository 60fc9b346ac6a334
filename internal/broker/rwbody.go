package broker

import (
	"encoding/json"
	"slices"
	"strconv"
)

// K's body is read at every derivation of a read-write lock's state
// (each listing, each transaction's answer: two or three per cycle) and
// written at every arrival and grant. encoding/json's reflection on the
// map cost an uncontended read cycle more CPU than the rest of its state
// handling together, so the form this broker writes is decoded and
// encoded by hand; anything else (another writer's spacing, escapes,
// other modes) goes through encoding/json as before, with the same result.

// decodeRWBody decodes K's value into b: the fast path for the form
// encodeRWBody writes, encoding/json otherwise.
func decodeRWBody(v []byte, b *rwBody) error {
	if fastDecodeRWBody(v, b) {
		return nil
	}
	*b = rwBody{}
	return json.Unmarshal(v, b)
}

// fastDecodeRWBody decodes exactly `{"Holders":{("<sid>":"r"|"w"),*}(,"Seq":n)?}`
// with session ids of [0-9A-Za-z-] and n a JSON integer that fits uint64;
// false (b unspecified) for anything else.
func fastDecodeRWBody(v []byte, b *rwBody) bool {
	const head = `{"Holders":{`
	if len(v) < len(head) || string(v[:len(head)]) != head {
		return false
	}
	i := len(head)
	holders := map[string]string{}
	if i < len(v) && v[i] == '}' {
		i++
	} else {
		for {
			if i >= len(v) || v[i] != '"' {
				return false
			}
			i++
			j := i
			for j < len(v) && sidByte(v[j]) {
				j++
			}
			// "<sid>":"r" or "w", then , or }
			if j == i || j+6 > len(v) || v[j] != '"' || v[j+1] != ':' || v[j+2] != '"' || (v[j+3] != 'r' && v[j+3] != 'w') || v[j+4] != '"' {
				return false
			}
			holders[string(v[i:j])] = string(v[j+3 : j+4])
			i = j + 5
			if v[i] == '}' {
				i++
				break
			}
			if v[i] != ',' {
				return false
			}
			i++
		}
	}
	var seq uint64
	switch {
	case i < len(v) && v[i] == '}':
		i++
	case len(v)-i > len(`,"Seq":}`) && string(v[i:i+7]) == `,"Seq":` && v[len(v)-1] == '}':
		digits := v[i+7 : len(v)-1]
		if len(digits) > 1 && digits[0] == '0' {
			return false // not a JSON number
		}
		for _, c := range digits {
			if c < '0' || c > '9' {
				return false
			}
		}
		n, err := strconv.ParseUint(string(digits), 10, 64)
		if err != nil {
			return false
		}
		seq, i = n, len(v)
	default:
		return false
	}
	if i != len(v) {
		return false
	}
	b.Holders, b.Seq = holders, seq
	return true
}

func sidByte(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-'
}

// encodeRWBody is json.Marshal(b), byte for byte (keys sorted, Seq
// omitted when 0), written by hand when every holder fits the fast form.
func encodeRWBody(b rwBody) ([]byte, error) {
	if b.Holders == nil {
		return json.Marshal(b)
	}
	sids := make([]string, 0, len(b.Holders))
	n := len(`{"Holders":{},"Seq":}`) + 20
	for sid, m := range b.Holders {
		if m != "r" && m != "w" || sid == "" {
			return json.Marshal(b)
		}
		for i := 0; i < len(sid); i++ {
			if !sidByte(sid[i]) {
				return json.Marshal(b)
			}
		}
		sids = append(sids, sid)
		n += len(sid) + 7
	}
	slices.Sort(sids)
	out := make([]byte, 0, n)
	out = append(out, `{"Holders":{`...)
	for i, sid := range sids {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, sid...)
		out = append(out, `":"`...)
		out = append(out, b.Holders[sid]...)
		out = append(out, '"')
	}
	out = append(out, '}')
	if b.Seq != 0 {
		out = append(out, `,"Seq":`...)
		out = strconv.AppendUint(out, b.Seq, 10)
	}
	return append(out, '}'), nil
}
