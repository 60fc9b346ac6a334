package consulstore

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// txnEndpoint makes PUT /v1/txn calls itself, as api.Txn makes them (the
// same URL, query parameters, headers and HTTP client, so the recorder
// transport, TLS and the connection budget are the same), without the api
// package's reflection: the body is written by hand and the answer decoded
// into the few fields the Store reads. Built once from the client's final
// config (after api.NewClient filled in the environment).
type txnEndpoint struct {
	hc  *http.Client
	url string
	tok string
	// header is shared by every request and never modified.
	header http.Header
}

// newTxnEndpoint follows api.Client.newRequest, request.toHTTP and
// doRequest for PUT /v1/txn with empty QueryOptions.
func newTxnEndpoint(cfg *api.Config) *txnEndpoint {
	u := url.URL{Scheme: cfg.Scheme, Host: requestHost(cfg.Address), Path: cfg.PathPrefix + "/v1/txn"}
	q := url.Values{}
	if cfg.Datacenter != "" {
		q.Set("dc", cfg.Datacenter)
	}
	if cfg.Namespace != "" {
		q.Set("ns", cfg.Namespace)
	}
	if cfg.Partition != "" {
		q.Set("partition", cfg.Partition)
	}
	if cfg.WaitTime != 0 {
		q.Set("wait", fmt.Sprintf("%dms", cfg.WaitTime.Milliseconds()))
	}
	u.RawQuery = q.Encode()
	h := http.Header{}
	if cfg.Token != "" {
		h.Set("X-Consul-Token", cfg.Token)
	}
	if cfg.HttpAuth != nil {
		r := http.Request{Header: h}
		r.SetBasicAuth(cfg.HttpAuth.Username, cfg.HttpAuth.Password)
	}
	h.Set("Content-Type", "application/json; charset=utf-8")
	return &txnEndpoint{hc: cfg.HttpClient, url: u.String(), tok: cfg.Token, header: h}
}

// token is the ACL token the calls send.
func (e *txnEndpoint) token() string { return e.tok }

// txnAnswer is the part of Consul's TxnResponse the Store reads.
type txnAnswer struct {
	Results []struct{ KV *txnKV }
	Errors  []txnErr
}

// txnKV is the part of a result's KV entry the Store reads.
type txnKV struct {
	Key                                 string
	Value                               []byte
	Flags                               uint64
	Session                             string
	LockIndex, CreateIndex, ModifyIndex uint64
}

// txnErr is one failing op of a rolled-back transaction.
type txnErr struct {
	OpIndex int
	What    string
}

// answerBufs are buffers for reading answers; one too large is dropped.
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledAnswer = 64 << 10

// do runs the transaction: ok is true for HTTP 200, false for 409 (rolled
// back, with Errors). Any other answer is api.Txn's error. Without
// results, the answer to a transaction that passed is read but not
// decoded (the answer is nil).
func (e *txnEndpoint) do(ctx context.Context, ops []broker.Op, results bool) (bool, *txnAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, e.url, bytes.NewReader(encodeTxn(ops)))
	if err != nil {
		return false, nil, err
	}
	req.Header = e.header
	resp, err := e.hc.Do(req)
	if err != nil {
		return false, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	buf := answerBufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			answerBufs.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusConflict {
			return false, nil, err
		}
		//lint:ignore ST1005 api.Txn's text
		return false, nil, fmt.Errorf("Failed to read response: %v", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
		//lint:ignore ST1005 api.Txn's text
		return false, nil, fmt.Errorf("Failed request: %s", buf.String())
	}
	if resp.StatusCode == http.StatusOK && !results {
		return true, nil, nil
	}
	var a txnAnswer
	if err := decodeTxnAnswer(buf.Bytes(), &a); err != nil {
		return false, nil, err
	}
	return resp.StatusCode == http.StatusOK, &a, nil
}

// encodeTxn writes ops as api.TxnOps encode: [{"KV":{"Verb":..,"Key":..,
// "Value":base64 or null,"Flags":..,"Index":..,"Session":..}},...].
func encodeTxn(ops []broker.Op) []byte {
	b := make([]byte, 0, 2+encodedSize(ops))
	b = append(b, '[')
	for i, op := range ops {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"KV":{"Verb":`...)
		b = appendJSONString(b, string(op.Verb))
		b = append(b, `,"Key":`...)
		b = appendJSONString(b, op.Key)
		b = append(b, `,"Value":`...)
		if op.Value == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, op.Value)
			b = append(b, '"')
		}
		b = append(b, `,"Flags":`...)
		b = strconv.AppendUint(b, op.Flags, 10)
		b = append(b, `,"Index":`...)
		b = strconv.AppendUint(b, op.Index, 10)
		b = append(b, `,"Session":`...)
		b = appendJSONString(b, op.Session)
		b = append(b, "}}"...)
	}
	return append(b, ']')
}

// appendJSONString appends s as a JSON string, as encoding/json writes it
// (invalid UTF-8 as U+FFFD), without its HTML escaping, which JSON does
// not need.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
