//go:build tools

// Package tools records the Consul agent as a dependency of this module.
package tools

import _ "github.com/hashicorp/consul"
