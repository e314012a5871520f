package calls

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/abi"
)

// Reasons of a denied call (abi.CallError.Reason).
const (
	ReasonDestination          = "destination"
	ReasonPrivateAddress       = "private_address"
	ReasonMethod               = "method"
	ReasonEndpoint             = "endpoint"
	ReasonModel                = "model"
	ReasonSecret               = "secret"
	ReasonCallsPerTurn         = "calls_per_turn"
	ReasonResponseBytesPerTurn = "response_bytes_per_turn"
	ReasonTokensPerTurn        = "tokens_per_turn"
	ReasonTokensPerDay         = "tokens_per_day"
)

// Capabilities are what one agent's turns may do through host calls
// (docs/DESIGN.md "Host calls and the journal": capabilities). The zero value
// denies every call: no destination, no endpoint, no secret.
type Capabilities struct {
	// HTTP are the destinations http calls may reach.
	HTTP []HTTPRule
	// Models are the names of the model endpoints (config models:) the
	// agent may call.
	Models []string
	// Secrets are the names of the secrets the agent may have filled into
	// its http calls' header values ("{{secret:NAME}}").
	Secrets []string
	// Limits bound the agent's calls per turn and its tokens per day.
	Limits Limits
	// Approval names the allowed calls that also need an approver's
	// decision before they go out (the host's journal caller asks; the
	// executor does not look at it).
	Approval ApprovalRules
	// Namespace is the namespace of the agent granted these (set by the
	// host from the agent, not by the config): its "{{secret:NAME}}"
	// placeholders resolve there and nowhere else.
	Namespace string
}

// Limits bound host calls. A zero field sets no limit of its own: the
// host-wide caps still hold (host_calls.max_response_bytes per call, the
// endpoint's max_tokens per model call).
type Limits struct {
	// CallsPerTurn is the number of host calls one attempt of a turn may
	// make.
	CallsPerTurn int
	// ResponseBytesPerTurn bounds the response bytes (http bodies, model
	// streams as received) of one attempt, in bytes.
	ResponseBytesPerTurn int64
	// TokensPerTurn bounds model tokens (input + output) of one attempt.
	TokensPerTurn int64
	// TokensPerDay bounds the agent's model tokens (input + output) per
	// UTC day, as counted by the integrator's Budget.TokensToday.
	TokensPerDay int64
}

// HTTPRule allows one destination.
//
// The private-address rule (enforced on every connection, after DNS
// resolution, by Egress): a connection to a loopback, link-local
// (169.254.0.0/16 — the cloud metadata address 169.254.169.254 included —
// fe80::/10), private (10/8, 172.16/12, 192.168/16, fc00::/7), CGNAT
// (100.64.0.0/10), unspecified or multicast address, or to the host's own
// API listen address, is refused (denied, reason private_address) unless
// the rule that allowed the request names it explicitly: Host is an IP
// literal (the connection goes to exactly that address), or Host is an
// exact name (no wildcard) and AllowPrivate is true (the name may resolve
// to a private address). A wildcard rule never reaches a private address.
type HTTPRule struct {
	// Scheme is http or https.
	Scheme string
	// Host is an exact host name ("api.example.com", compared without
	// case), an IP literal ("127.0.0.1", "::1"), or a suffix wildcard
	// "*.example.com" matching any name below example.com (not
	// example.com itself).
	Host string
	// Port is the destination port; 0 means the scheme's default (80 or
	// 443).
	Port int
	// Methods are the allowed methods, upper case; empty means GET and
	// HEAD.
	Methods []string
	// AllowPrivate lets an exact-name rule reach private addresses (see
	// the rule above). Meaningless on an IP literal (always explicit);
	// refused on a wildcard by ValidateRule.
	AllowPrivate bool
	// Secrets, when not empty, are the only secrets filled into requests
	// this rule allows (each must also be granted in Capabilities.Secrets):
	// it binds a credential to the destination it is meant for
	// (invariant 13). A secret some rule lists is filled only under the
	// rules that list it; a rule with no list takes the granted secrets no
	// rule lists.
	Secrets []string
}

// ValidateRule checks a rule's shape; the error names the field.
func ValidateRule(r HTTPRule) error {
	if r.Scheme != "http" && r.Scheme != "https" {
		return fmt.Errorf("scheme %q: want http or https", r.Scheme)
	}
	h := r.Host
	if h == "" {
		return fmt.Errorf("host is empty")
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		// An IP literal.
	} else {
		name := strings.TrimPrefix(h, "*.")
		if strings.Contains(name, "*") {
			return fmt.Errorf("host %q: a wildcard is only allowed as a leading \"*.\"", h)
		}
		if !validHostName(name) {
			return fmt.Errorf("host %q: not a host name, an IP literal or \"*.\" followed by a host name", h)
		}
		if strings.HasPrefix(h, "*.") && !strings.Contains(name, ".") {
			return fmt.Errorf("host %q: a wildcard needs at least two labels after \"*.\"", h)
		}
		if strings.HasPrefix(h, "*.") && r.AllowPrivate {
			return fmt.Errorf("host %q: allow_private needs an exact host name, not a wildcard", h)
		}
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Errorf("port %d: want 0 (the scheme's default) to 65535", r.Port)
	}
	for _, m := range r.Methods {
		if m == "" || m != strings.ToUpper(m) || strings.ContainsAny(m, " \t\r\n\x00") {
			return fmt.Errorf("method %q: want an upper-case HTTP method", m)
		}
	}
	for _, s := range r.Secrets {
		if s == "" || strings.ContainsAny(s, "{}") {
			return fmt.Errorf("secrets: name %q", s)
		}
	}
	return nil
}

func validHostName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// denied returns a CallDenied error with reason.
func denied(reason, format string, args ...any) *abi.CallError {
	return &abi.CallError{Code: abi.CallDenied, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// callErr returns a CallError of code.
func callErr(code abi.CallErrorCode, format string, args ...any) *abi.CallError {
	return &abi.CallError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// dest is a parsed destination.
type dest struct {
	scheme string
	host   string // lower case, no brackets
	port   int
}

func (d dest) String() string {
	return d.scheme + "://" + net.JoinHostPort(d.host, strconv.Itoa(d.port))
}

// parseDest parses an absolute http(s) URL into its destination.
func parseDest(raw string) (dest, *url.URL, *abi.CallError) {
	u, err := url.Parse(raw)
	if err != nil {
		return dest{}, nil, callErr(abi.CallInvalid, "http.url: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return dest{}, nil, callErr(abi.CallInvalid, "http.url: scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" || u.Hostname() == "" {
		return dest{}, nil, callErr(abi.CallInvalid, "http.url: no host")
	}
	if u.User != nil {
		return dest{}, nil, callErr(abi.CallInvalid, "http.url: user information is not allowed (use a header with a secret)")
	}
	d := dest{scheme: u.Scheme, host: strings.ToLower(u.Hostname())}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return dest{}, nil, callErr(abi.CallInvalid, "http.url: port %q", p)
		}
		d.port = n
	} else if d.scheme == "https" {
		d.port = 443
	} else {
		d.port = 80
	}
	return d, u, nil
}

// matches reports whether the rule allows the destination (method aside).
func (r HTTPRule) matches(d dest) bool {
	if r.Scheme != d.scheme {
		return false
	}
	port := r.Port
	if port == 0 {
		port = 80
		if r.Scheme == "https" {
			port = 443
		}
	}
	if port != d.port {
		return false
	}
	h := strings.ToLower(strings.Trim(r.Host, "[]"))
	if a, err := netip.ParseAddr(h); err == nil {
		b, err := netip.ParseAddr(d.host)
		return err == nil && a.Unmap() == b.Unmap()
	}
	if suffix, ok := strings.CutPrefix(h, "*."); ok {
		return strings.HasSuffix(d.host, "."+suffix)
	}
	return h == d.host
}

func (r HTTPRule) allowsMethod(m string) bool {
	if len(r.Methods) == 0 {
		return m == "GET" || m == "HEAD"
	}
	return slices.Contains(r.Methods, m)
}

// explicitAddr returns the IP literal the rule names, if any.
func (r HTTPRule) explicitAddr() (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.Trim(r.Host, "[]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// allowsPrivate reports whether the rule names its destination explicitly
// enough to reach a private address (see HTTPRule).
func (r HTTPRule) allowsPrivate() bool {
	if _, ok := r.explicitAddr(); ok {
		return true
	}
	return r.AllowPrivate && !strings.HasPrefix(r.Host, "*.")
}

// CheckHTTP checks an http call's method and URL against the allowed
// destinations. A refusal is a
// *abi.CallError: denied with reason destination (no rule for the scheme,
// host and port) or method (a rule for the destination, not this method);
// a malformed URL is invalid_request. The resolved address is checked
// later, at connection time, by Egress.
func (c Capabilities) CheckHTTP(method, rawURL string) error {
	d, _, cerr := parseDest(rawURL)
	if cerr != nil {
		return cerr
	}
	_, err := c.checkDest(method, d)
	return err
}

// checkDest returns the first rule that allows method to d.
func (c Capabilities) checkDest(method string, d dest) (HTTPRule, error) {
	hostMatch := false
	for _, r := range c.HTTP {
		if !r.matches(d) {
			continue
		}
		hostMatch = true
		if r.allowsMethod(method) {
			return r, nil
		}
	}
	if hostMatch {
		return HTTPRule{}, denied(ReasonMethod, "method %s is not allowed for %s", method, d)
	}
	return HTTPRule{}, denied(ReasonDestination, "destination %s is not allowed", d)
}

// CheckEndpoint checks that the agent may use the named model endpoint
// (denied, reason endpoint).
func (c Capabilities) CheckEndpoint(endpoint string) error {
	if !slices.Contains(c.Models, endpoint) {
		return denied(ReasonEndpoint, "model endpoint %q is not granted", endpoint)
	}
	return nil
}

// CheckSecret checks that the agent may use the named secret (denied,
// reason secret). It does not say whether the secret exists.
func (c Capabilities) CheckSecret(name string) error {
	if !slices.Contains(c.Secrets, name) {
		return denied(ReasonSecret, "secret %q is not granted", name)
	}
	return nil
}

// checkSecretFor checks a secret for a request the rule allowed: granted,
// and listed by the rule when the rule lists any.
func (c Capabilities) checkSecretFor(rule HTTPRule, name string) *abi.CallError {
	if err := c.CheckSecret(name); err != nil {
		return err.(*abi.CallError)
	}
	if len(rule.Secrets) > 0 && !slices.Contains(rule.Secrets, name) {
		return denied(ReasonSecret, "secret %q may not be sent to %s (the rule lists its secrets)", name, rule.Host)
	}
	if len(rule.Secrets) == 0 {
		// A secret bound to some destination is sent nowhere else, also
		// not under a broader rule that lists nothing.
		for _, r := range c.HTTP {
			if slices.Contains(r.Secrets, name) {
				return denied(ReasonSecret, "secret %q is bound to %s by its rule; it may not be sent to %s", name, r.Host, rule.Host)
			}
		}
	}
	return nil
}
