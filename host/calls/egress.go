package calls

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// Defaults of host-call settings (config host_calls:).
const (
	// DefaultTimeout bounds one host call (the turn's deadline still
	// applies when earlier).
	DefaultTimeout = 60 * time.Second
	// DefaultMaxResponseBytes caps one call's response body (or model
	// stream), in bytes.
	DefaultMaxResponseBytes = 4 << 20
	// MaxRedirects is how many redirects an http call follows.
	MaxRedirects = 5
	// MaxResponseBytesCeiling is the highest per-call response cap: a body
	// of this size, base64 in a CallResult with its headers, stays under
	// abi.MaxCallResultBytes.
	MaxResponseBytesCeiling = abi.MaxCallResultBytes/4*3 - 256<<10
)

// EgressConfig configures the host's outbound HTTP client.
type EgressConfig struct {
	// OwnAddrs are the host's own API listen addresses, refused unless a
	// rule names the address as an IP literal. An unspecified address
	// (0.0.0.0, ::) stands for every address of the machine's interfaces.
	OwnAddrs []netip.AddrPort
	// LookupIP resolves a host name; nil means net.DefaultResolver. Tests
	// and operators with their own resolver set it.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// Logger receives debug lines (destination, status, bytes; never a
	// secret). Nil means slog.Default().
	Logger *slog.Logger
}

// Egress is the host's outbound HTTP client for http host calls. Every
// connection is checked after DNS resolution against the private-address
// rule (HTTPRule) — connections are never reused between requests
// (keep-alives are off), so a check made for one agent's rule can never
// serve another's request, and a re-resolved name is checked again.
// Environment proxies are not used. It is safe for concurrent use.
type Egress struct {
	client *http.Client
	own    []netip.AddrPort
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	log    *slog.Logger
}

// NewEgress returns an Egress.
func NewEgress(cfg EgressConfig) *Egress {
	e := &Egress{lookup: cfg.LookupIP, log: cfg.Logger}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.lookup == nil {
		e.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	for _, ap := range cfg.OwnAddrs {
		if !ap.Addr().IsUnspecified() {
			e.own = append(e.own, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
			continue
		}
		e.own = append(e.own, netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port()))
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					e.own = append(e.own, netip.AddrPortFrom(p.Addr().Unmap(), ap.Port()))
				}
			}
		}
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            e.dial,
		DisableKeepAlives:      true,
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    15 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	e.client = &http.Client{Transport: tr, CheckRedirect: e.checkRedirect}
	return e
}

// policy is what the dialer of one http call checks against. The rule
// changes when a redirect is followed.
type policy struct {
	caps Capabilities
	mu   sync.Mutex
	rule HTTPRule
	// origin is the first request's destination; secretHeaders are the
	// header names filled with secrets, dropped on a redirect elsewhere.
	origin        dest
	secretHeaders []string
	// approved is what an approver approved of the first request
	// (ApprovalRules.NeedsApproval), "" when it needed no approval: a
	// redirect to a destination that needs approval is followed only when
	// it is that same one.
	approved string
}

func (p *policy) current() HTTPRule {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rule
}

type policyKey struct{}

// privatePrefixes are refused unless named explicitly (HTTPRule).
var privatePrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("255.255.255.255/32"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),    // NAT64 of any IPv4 address: judged as a whole
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use NAT64 (RFC 8215)
	netip.MustParsePrefix("::/96"),           // IPv4-compatible (deprecated)
	netip.MustParsePrefix("::ffff:0:0:0/96"), // IPv4-translated (SIIT)
	netip.MustParsePrefix("fec0::/10"),       // site-local (deprecated)
}

// sixToFour is 6to4 (RFC 3056): its bits 16..47 are an IPv4 address,
// judged as that address.
var sixToFour = netip.MustParsePrefix("2002::/16")

// IsPrivateAddr reports whether a is an address Egress refuses unless a
// rule names it: loopback, link-local, private (RFC 1918, fc00::/7),
// CGNAT 100.64.0.0/10, unspecified, multicast, and a few special-purpose
// ranges (0.0.0.0/8, 192.0.0.0/24, 198.18.0.0/15, 240.0.0.0/4, broadcast,
// NAT64 and the other IPv6 forms embedding an IPv4 address, site-local);
// a 6to4 address is judged by its IPv4 address.
func IsPrivateAddr(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() ||
		a.IsPrivate() || a.IsUnspecified() || a.IsMulticast() {
		return true
	}
	for _, p := range privatePrefixes {
		if p.Contains(a) {
			return true
		}
	}
	if sixToFour.Contains(a) {
		b := a.As16()
		return IsPrivateAddr(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
	}
	return false
}

// checkAddr applies the private-address rule to one resolved address.
func (e *Egress) checkAddr(rule HTTPRule, a netip.Addr, port uint16) *abi.CallError {
	a = a.Unmap()
	lit, isLit := rule.explicitAddr()
	if isLit && lit != a {
		return denied(ReasonDestination, "address %s is not the one the rule names", a)
	}
	for _, own := range e.own {
		if own.Port() == port && (own.Addr() == a || own.Addr().IsUnspecified() && IsPrivateAddr(a)) && !isLit {
			return denied(ReasonPrivateAddress, "address %s is the host's own API address", netip.AddrPortFrom(a, port))
		}
	}
	if IsPrivateAddr(a) && !rule.allowsPrivate() {
		return denied(ReasonPrivateAddress, "address %s is private (loopback, link-local, private, CGNAT, unspecified or multicast) and the rule for %q does not name it", a, rule.Host)
	}
	return nil
}

// dial resolves addr, checks every address and connects to the first
// allowed one.
func (e *Egress) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	p, _ := ctx.Value(policyKey{}).(*policy)
	if p == nil {
		return nil, errors.New("egress: dial without a call policy")
	}
	rule := p.current()
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("egress: port %q: %w", portStr, err)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = e.lookup(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("egress: resolve %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("egress: resolve %s: no addresses", host)
		}
	}
	var firstErr error
	d := net.Dialer{Timeout: 30 * time.Second}
	for _, a := range addrs {
		if cerr := e.checkAddr(rule, a, uint16(port)); cerr != nil {
			if firstErr == nil {
				firstErr = cerr
			}
			continue
		}
		conn, err := d.DialContext(ctx, network, netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			return conn, nil
		}
		if firstErr == nil || isCallErr(firstErr) {
			firstErr = err
		}
	}
	return nil, firstErr
}

func isCallErr(err error) bool {
	var ce *abi.CallError
	return errors.As(err, &ce)
}

// checkRedirect follows a redirect only to a destination the same
// capabilities allow (the dialer then checks its addresses), and drops
// headers filled with secrets when the destination changes.
func (e *Egress) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > MaxRedirects {
		return http.ErrUseLastResponse
	}
	p, _ := req.Context().Value(policyKey{}).(*policy)
	if p == nil {
		return errors.New("egress: redirect without a call policy")
	}
	d, _, cerr := parseDest(req.URL.String())
	if cerr != nil {
		return denied(ReasonDestination, "redirect to a URL that is not http(s): %s", cerr.Message)
	}
	rule, err := p.caps.checkDest(req.Method, d)
	if err != nil {
		var ce *abi.CallError
		if errors.As(err, &ce) {
			ce.Message = "redirect: " + ce.Message
		}
		return err
	}
	// Approval is asked of the URL the agent sent, before the call goes
	// out: a redirect must not lead to a destination an approval rule
	// guards that nobody approved.
	if what, ok := p.caps.Approval.NeedsApproval(&abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: req.Method, URL: req.URL.String()}}); ok && what != p.approved {
		return denied(ReasonApproval, "redirect to %s, which needs an approver's decision (only the call's own destination was approved)", what)
	}
	if d != p.origin {
		for _, h := range p.secretHeaders {
			req.Header.Del(h)
		}
	}
	p.mu.Lock()
	p.rule = rule
	p.mu.Unlock()
	return nil
}

// secretRE matches a secret placeholder in a header value.
var secretRE = regexp.MustCompile(`\{\{secret:([^{}]*)\}\}`)

// ValidateHTTP checks an http request's shape beyond abi's Validate:
// method, header names and values (no CR, LF or NUL), body size. The
// error is invalid_request or too_large.
func ValidateHTTP(r *abi.HTTPRequest) *abi.CallError {
	m := r.Method
	if m == "" {
		m = http.MethodGet
	}
	for _, c := range m {
		if c < 'A' || c > 'Z' {
			return callErr(abi.CallInvalid, "http.method %q: want an upper-case HTTP method", m)
		}
	}
	for k, v := range r.Headers {
		if k == "" || strings.ContainsAny(k, "\r\n\x00: \t") {
			return callErr(abi.CallInvalid, "http.headers: name %q holds CR, LF, NUL, a colon or a space", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return callErr(abi.CallInvalid, "http.headers[%q]: the value holds CR, LF or NUL", k)
		}
	}
	if len(r.Body) > abi.MaxCallRequestBytes {
		return callErr(abi.CallTooLarge, "http.body: %d bytes, more than %d", len(r.Body), abi.MaxCallRequestBytes)
	}
	return nil
}

// scrubber removes filled secret values from text: each value as it is
// and in the encodings a reflecting server commonly uses (base64 and
// base64url with and without padding, percent-encoding, JSON string
// escaping, hex). Scrubbing can never be complete — a value embedded in a
// larger base64 text, or transformed any other way, passes — so a secret
// must be granted only to destinations that do not reflect it
// (docs/DESIGN.md invariant 13).
type scrubber struct{ values map[string][]string } // name → value and its encodings

func (s *scrubber) add(name, value string) {
	if value == "" {
		return
	}
	if s.values == nil {
		s.values = map[string][]string{}
	}
	forms := []string{value,
		base64.StdEncoding.EncodeToString([]byte(value)), base64.RawStdEncoding.EncodeToString([]byte(value)),
		base64.URLEncoding.EncodeToString([]byte(value)), base64.RawURLEncoding.EncodeToString([]byte(value)),
		url.QueryEscape(value), url.PathEscape(value), hex.EncodeToString([]byte(value)), strings.ToUpper(hex.EncodeToString([]byte(value))),
	}
	if j, err := json.Marshal(value); err == nil {
		forms = append(forms, string(j[1:len(j)-1]))
	}
	var uniq []string
	for _, f := range forms {
		// Longest first, so that a form containing another is replaced
		// whole; forms too short to be a secret's are not worth it.
		if len(f) >= 4 && !slices.Contains(uniq, f) {
			uniq = append(uniq, f)
		}
	}
	slices.SortFunc(uniq, func(a, b string) int { return len(b) - len(a) })
	s.values[name] = uniq
}

// maxLen is the length of the longest form the scrubber replaces (0:
// none).
func (s *scrubber) maxLen() int {
	n := 0
	for _, forms := range s.values {
		for _, f := range forms {
			n = max(n, len(f))
		}
	}
	return n
}

func (s *scrubber) str(in string) string {
	for name, forms := range s.values {
		for _, v := range forms {
			in = strings.ReplaceAll(in, v, "[secret:"+name+"]")
		}
	}
	return in
}

func (s *scrubber) bytes(in []byte) []byte {
	for name, forms := range s.values {
		for _, v := range forms {
			in = bytes.ReplaceAll(in, []byte(v), []byte("[secret:"+name+"]"))
		}
	}
	return in
}

// HTTPCall is one http call for Egress.Do.
type HTTPCall struct {
	// Caps are the calling agent's capabilities.
	Caps Capabilities
	// Request is the call; it is not modified.
	Request *abi.HTTPRequest
	// Secrets fills "{{secret:NAME}}" placeholders; nil means none exist.
	Secrets *Secrets
	// MaxResponseBytes caps the response body (over it: too_large); ≤ 0
	// means DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// Timeout bounds the call (ctx's deadline applies when earlier); 0
	// means DefaultTimeout.
	Timeout time.Duration
}

// Do performs an http call: capability check, secret filling, the
// request with its redirects, and the capped response. A refused or
// failed call is a *abi.CallError (denied, invalid_request, too_large,
// timeout, cancelled, not_configured, upstream with Status 0 for a
// connection failure); a response of any status is a response. The
// returned byte count is the body bytes read (for the turn's budget), also
// on too_large. No secret value appears in the response or the error.
func (e *Egress) Do(ctx context.Context, call HTTPCall) (*abi.HTTPResponse, int64, error) {
	r := call.Request
	if cerr := ValidateHTTP(r); cerr != nil {
		return nil, 0, cerr
	}
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	d, u, cerr := parseDest(r.URL)
	if cerr != nil {
		return nil, 0, cerr
	}
	rule, err := call.Caps.checkDest(method, d)
	if err != nil {
		return nil, 0, err
	}
	// Secrets are filled only after the destination check.
	var scrub scrubber
	pol := &policy{caps: call.Caps, rule: rule, origin: d}
	pol.approved, _ = call.Caps.Approval.NeedsApproval(&abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: method, URL: r.URL}})
	header := http.Header{}
	for k, v := range r.Headers {
		filled, had, cerr := fillSecrets(ctx, call, rule, v, &scrub)
		if cerr != nil {
			return nil, 0, cerr
		}
		if had {
			pol.secretHeaders = append(pol.secretHeaders, k)
		}
		header.Set(k, filled)
	}
	if len(pol.secretHeaders) > 0 {
		// The transport then asks for gzip itself and decodes the body, so
		// the scrubber sees a reflected secret in plain text (the agent's
		// own Accept-Encoding would hand it the compressed bytes).
		header.Del("Accept-Encoding")
		// Nor may it ask for a reflected secret piece by piece.
		header.Del("Range")
		header.Del("If-Range")
	}
	timeout := call.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	maxBytes := call.MaxResponseBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxResponseBytes
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, ctxErr(ctx, err)
	}
	cctx, cancel := context.WithTimeout(context.WithValue(ctx, policyKey{}, pol), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, method, u.String(), bytes.NewReader(r.Body))
	if err != nil {
		return nil, 0, callErr(abi.CallInvalid, "http: %s", scrub.str(err.Error()))
	}
	if len(r.Body) == 0 {
		req.Body, req.GetBody, req.ContentLength = nil, nil, 0
	}
	req.Header = header
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "paddock-host-call")
	}
	start := time.Now()
	resp, err := e.client.Do(req)
	if err != nil {
		cerr := mapErr(ctx, cctx, err, &scrub)
		e.log.DebugContext(ctx, "host call http failed", "destination", d.String(), "code", cerr.Code, "reason", cerr.Reason, "error", cerr.Message)
		return nil, 0, cerr
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	n := int64(len(body))
	if err != nil {
		cerr := mapErr(ctx, cctx, err, &scrub)
		return nil, n, cerr
	}
	if n > maxBytes {
		return nil, n, callErr(abi.CallTooLarge, "the response body exceeds %d bytes", maxBytes)
	}
	out := &abi.HTTPResponse{Status: resp.StatusCode, Body: scrub.bytes(body)}
	if len(resp.Header) > 0 {
		out.Headers = make(map[string]string, len(resp.Header))
		for k, vs := range resp.Header {
			out.Headers[k] = scrub.str(strings.Join(vs, ", "))
		}
	}
	e.log.DebugContext(ctx, "host call http", "destination", d.String(), "status", resp.StatusCode, "bytes", n, "duration", time.Since(start))
	return out, n, nil
}

// fillSecrets replaces the placeholders of one header value.
func fillSecrets(ctx context.Context, call HTTPCall, rule HTTPRule, v string, scrub *scrubber) (string, bool, *abi.CallError) {
	matches := secretRE.FindAllStringSubmatchIndex(v, -1)
	if len(matches) == 0 {
		return v, false, nil
	}
	var b strings.Builder
	last := 0
	for _, m := range matches {
		name := v[m[2]:m[3]]
		if cerr := call.Caps.checkSecretFor(rule, name); cerr != nil {
			return "", false, cerr
		}
		val, err := call.Secrets.ResolveIn(ctx, call.Caps.Namespace, name)
		if err != nil {
			// The error names the secret and its source, never a value.
			return "", false, callErr(abi.CallNotConfigured, "%v", err)
		}
		scrub.add(name, val)
		b.WriteString(v[last:m[0]])
		b.WriteString(val)
		last = m[1]
	}
	b.WriteString(v[last:])
	filled := b.String()
	if strings.ContainsAny(filled, "\r\n\x00") {
		return "", false, callErr(abi.CallInvalid, "a secret filled into a header holds CR, LF or NUL")
	}
	return filled, true, nil
}

// ctxErr maps a context error of the turn's ctx.
func ctxErr(ctx context.Context, err error) *abi.CallError {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return callErr(abi.CallTimeout, "the turn's deadline passed")
	}
	return callErr(abi.CallCancelled, "the turn was cancelled")
}

// mapErr maps a transport error: a CallError inside (a denial by the
// dialer or a redirect check) as is, the call's or the turn's deadline to
// timeout, the turn's cancellation to cancelled, anything else to
// upstream with status 0. The message is scrubbed.
func mapErr(ctx, cctx context.Context, err error, scrub *scrubber) *abi.CallError {
	var ce *abi.CallError
	switch {
	case errors.As(err, &ce):
		out := *ce
		out.Message = scrub.str(out.Message)
		return &out
	case ctx.Err() != nil:
		return ctxErr(ctx, ctx.Err())
	case cctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return callErr(abi.CallTimeout, "the call's deadline passed")
	default:
		return &abi.CallError{Code: abi.CallUpstream, Message: scrub.str(err.Error())}
	}
}
