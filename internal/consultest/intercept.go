package consultest

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// Intercept puts an HTTP server in front of the agent's HTTP API for t:
// each request goes to handle, which answers it itself or passes it on
// with agent.ServeHTTP (a reverse proxy to the agent). It returns a client
// configuration that goes through it. For agents that speak plain HTTP.
func (a *Agent) Intercept(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, agent http.Handler)) *api.Config {
	t.Helper()
	target, err := url.Parse("http://" + a.HTTPAddr())
	if err != nil {
		t.Fatalf("consultest: agent address: %v", err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle(w, r, rp)
	}))
	t.Cleanup(srv.Close)
	cfg := a.Config()
	cfg.Address = strings.TrimPrefix(srv.URL, "http://")
	return cfg
}
