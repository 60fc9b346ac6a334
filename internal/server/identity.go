package server

import (
	"context"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/lockbroker/lockbroker/internal/tenant"
)

// identify finds the caller: a bearer token when one is sent (an unknown
// one is refused, never passed over for the certificate), else the
// verified client certificate.
func identify(ctx context.Context, cfg *tenant.Config) (tenant.Caller, error) {
	token, sent, err := bearerToken(ctx)
	if err != nil {
		return tenant.Caller{}, err
	}
	if sent {
		caller, ok := cfg.MatchToken(token)
		if !ok {
			return caller, unauthenticated("bearer token not recognised")
		}
		return caller, nil
	}
	ids, err := certIdentities(ctx)
	if err != nil {
		return tenant.Caller{}, unauthenticated(err.Error())
	}
	if c := cfg.MatchCert(ids); c.Identity != "" {
		return c, nil
	}
	return tenant.Caller{}, unauthenticated("no identity: send a verified client certificate or an authorization: Bearer token")
}

// bearerToken is the token of the call's `authorization: Bearer` header;
// sent is false without the header.
func bearerToken(ctx context.Context) (token string, sent bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(authorizationHeader)
	switch {
	case len(vals) == 0:
		return "", false, nil
	case len(vals) > 1:
		return "", true, unauthenticated("more than one authorization header")
	}
	v := vals[0]
	if len(v) > maxAuthorizationSize || len(v) <= len(bearerScheme) || !strings.EqualFold(v[:len(bearerScheme)], bearerScheme) {
		return "", true, unauthenticated(`authorization must be "Bearer <token>"`)
	}
	return strings.TrimSpace(v[len(bearerScheme):]), true, nil
}

// certIdentities are the identities of the call's verified client
// certificate (none without one); an error for one that names its client
// ambiguously (see tenant.CertIdentities).
func certIdentities(ctx context.Context) ([]string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil, nil
	}
	return tenant.CertIdentities(info.State.VerifiedChains[0][0])
}

// presented is the identity a caller presents, unchecked (single-tenant
// mode): its token's, else its verified certificate's, else "".
func presented(ctx context.Context) string {
	if token, sent, err := bearerToken(ctx); sent && err == nil {
		return tenant.TokenIdentity(token)
	}
	if ids, _ := certIdentities(ctx); len(ids) > 0 {
		return ids[0]
	}
	return ""
}
