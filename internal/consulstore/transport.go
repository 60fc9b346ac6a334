package consulstore

import (
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
)

// newClient builds an api.Client for cfg on a transport of its own, capped
// at maxConns connections, and returns the client, its transport and its
// transaction endpoint (with the token it sends). api.NewClient fills cfg from the environment (token, TLS
// files) and sets the transport's TLS config from cfg.TLSConfig unless the
// transport already has one, so both clients of a Store get the same TLS.
// With pooled, the client's calls go over a connPool built from that
// transport's settings (dialer, TLS, idle timeout) when it can serve them;
// the pool is returned too (nil otherwise).
func newClient(cfg api.Config, maxConns int, pooled bool) (*api.Client, *http.Transport, *connPool, *txnEndpoint, error) {
	cfg.Transport = newTransport(cfg.Transport)
	cfg.HttpClient = nil
	c, err := api.NewClient(&cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	// cfg.HttpClient is now the client c uses (for a unix:// address, on a
	// transport api.NewClient made itself): limit and wrap its transport.
	tr := cfg.HttpClient.Transport.(*http.Transport)
	tr.MaxConnsPerHost = maxConns
	tr.MaxIdleConnsPerHost = maxConns
	tr.MaxIdleConns = max(tr.MaxIdleConns, maxConns)
	var pool *connPool
	if pooled {
		pool = openPool(tr, cfg.Scheme, requestHost(cfg.Address), maxConns)
	}
	if pool != nil {
		cfg.HttpClient.Transport = recorder{next: pool}
	} else {
		cfg.HttpClient.Transport = recorder{next: tr}
	}
	return c, tr, pool, newTxnEndpoint(&cfg), nil
}

// requestHost is the host the api package puts in its request URLs for
// address: "localhost" for a unix socket's path.
func requestHost(address string) string {
	if len(address) > 0 && address[0] == '/' {
		return "localhost"
	}
	return address
}

// newTransport returns a new transport with base's settings (those of
// api.DefaultConfig's pooled transport if base is nil) and no connections.
// It does not use base.Clone: Clone sets up HTTP/2 on base and on the copy,
// which gives both a TLS config, and api.NewClient then leaves out the one
// cfg.TLSConfig describes (CA, client certificate, server name).
//
// Compression is off: Consul's answers are small and near (the agent's
// gzip and our gunzip cost both sides CPU on every call, about 5% of the
// broker's per cycle).
func newTransport(base *http.Transport) *http.Transport {
	if base == nil {
		return &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          100,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: 1 * time.Second,
			ForceAttemptHTTP2:     true,
			DisableCompression:    true,
		}
	}
	tr := &http.Transport{
		Proxy:                  base.Proxy,
		OnProxyConnectResponse: base.OnProxyConnectResponse,
		DialContext:            base.DialContext,
		DialTLSContext:         base.DialTLSContext,
		TLSHandshakeTimeout:    base.TLSHandshakeTimeout,
		DisableKeepAlives:      base.DisableKeepAlives,
		DisableCompression:     true,
		MaxIdleConns:           base.MaxIdleConns,
		IdleConnTimeout:        base.IdleConnTimeout,
		ResponseHeaderTimeout:  base.ResponseHeaderTimeout,
		ExpectContinueTimeout:  base.ExpectContinueTimeout,
		ProxyConnectHeader:     base.ProxyConnectHeader.Clone(),
		MaxResponseHeaderBytes: base.MaxResponseHeaderBytes,
		WriteBufferSize:        base.WriteBufferSize,
		ReadBufferSize:         base.ReadBufferSize,
		ForceAttemptHTTP2:      base.ForceAttemptHTTP2,
	}
	if base.TLSClientConfig != nil {
		tr.TLSClientConfig = base.TLSClientConfig.Clone()
	}
	return tr
}

// secretsOf returns the credentials in cfg that must never appear in an
// error: the ACL token and the HTTP basic-auth password.
func secretsOf(cfg *api.Config, token string) []string {
	var out []string
	for _, s := range []string{token, cfg.Token} {
		if s != "" {
			out = append(out, s)
		}
	}
	if cfg.HttpAuth != nil && cfg.HttpAuth.Password != "" {
		out = append(out, cfg.HttpAuth.Password)
	}
	return out
}

// record is what the transport saw of one call's HTTP answer. The api
// package drops the status of some failures (a txn's "Failed request", a
// renewal's "Unexpected response code") and every response header of a
// failure; the recorder keeps them for classification.
type record struct {
	status     int    // HTTP status of the last response, 0 if none
	retryAfter string // its Retry-After header
}

// recordKey is the context key of a call's *record.
type recordKey struct{}

// recorder is an http.RoundTripper that stores what it sees of a response
// in the *record of the request's context, if any. It runs on the caller's
// goroutine (http.Client.Do calls it synchronously), so the caller reads
// the record after the call without further synchronization.
type recorder struct{ next http.RoundTripper }

func (t recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if resp != nil {
		if r, _ := req.Context().Value(recordKey{}).(*record); r != nil {
			r.status = resp.StatusCode
			r.retryAfter = resp.Header.Get("Retry-After")
		}
	}
	return resp, err
}
