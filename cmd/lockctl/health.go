package main

import (
	"context"
	"fmt"
	"net/http"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// cmdHealth implements `lockctl health`: exit 0 when the broker is serving.
// It is also the container health check (distroless images have no curl).
func cmdHealth(ctx context.Context, c *cli, args []string) error {
	var url string
	fs := c.flagSet("health", "[flags]",
		"Exit 0 if a broker answers the gRPC health check with SERVING, else print why\n"+
			"and exit 1. With --http, GET that URL instead and expect a 2xx answer.\n")
	fs.StringVar(&url, "http", "", "check this `URL` (e.g. http://127.0.0.1:8701/healthz) instead of gRPC")
	if _, err := c.parseArgs(fs, args); err != nil {
		return err
	}
	if url != "" {
		return httpHealth(ctx, c, url)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%s: %s", conn.Target(), resp.GetStatus())
	}
	fmt.Fprintf(c.stdout, "%s: SERVING\n", conn.Target())
	return nil
}

// httpHealth GETs url within --connect-timeout and wants a 2xx status.
func httpHealth(ctx context.Context, c *cli, url string) error {
	ctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	fmt.Fprintf(c.stdout, "%s: %s\n", url, resp.Status)
	return nil
}
