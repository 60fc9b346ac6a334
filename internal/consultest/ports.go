package consultest

import (
	"fmt"
	"io"
	"net"
	"strconv"
)

// ports are the loopback ports one agent listens on. DNS and gRPC are
// always disabled, so they have no entry.
type ports struct {
	HTTP, Server, SerfLAN, SerfWAN int
}

// hcl renders the ports block of the agent configuration.
func (p ports) hcl() string {
	return fmt.Sprintf("ports { http = %d  server = %d  serf_lan = %d  serf_wan = %d"+
		"  dns = -1  grpc = -1  grpc_tls = -1  https = -1 }", p.HTTP, p.Server, p.SerfLAN, p.SerfWAN)
}

// freePorts picks distinct loopback ports that are currently free for TCP
// and UDP (Serf needs both). If http is non-zero it is used as given. All
// probes are held open until every port is chosen, then released; another
// process can still grab one before the agent binds, which StartProcess
// handles by retrying.
func freePorts(http int) (ports, error) {
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	used := map[int]bool{http: http != 0}
	pick := func() (int, error) {
		for range 20 {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("consultest: pick free port: %w", err)
			}
			held = append(held, l)
			port := l.Addr().(*net.TCPAddr).Port
			u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil || used[port] {
				continue // UDP side busy (or duplicate): try another port
			}
			held = append(held, u)
			used[port] = true
			return port, nil
		}
		return 0, fmt.Errorf("consultest: no free TCP+UDP loopback port found")
	}
	var p ports
	var err error
	for _, dst := range []*int{&p.HTTP, &p.Server, &p.SerfLAN, &p.SerfWAN} {
		if dst == &p.HTTP && http != 0 {
			p.HTTP = http
			continue
		}
		if *dst, err = pick(); err != nil {
			return ports{}, err
		}
	}
	return p, nil
}
