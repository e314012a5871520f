package calls

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// ReasonApproval refines denied: an approver rejected the call, or its
// approval expired before anyone decided (docs/DESIGN.md "Waits and
// approvals").
const ReasonApproval = "approval"

// ApprovalRules name the host calls that need an approver's decision
// before they go out (Capabilities.Approval). A call must be allowed by
// the capabilities as well: approval is asked on top of the grant, never
// instead of it. The zero value asks for none.
type ApprovalRules struct {
	// HTTP: an http call matching any of these needs approval.
	HTTP []ApprovalHTTPRule
	// Models: a model call to any of these endpoints needs approval.
	Models []string
	// Timeout, when > 0, expires an undecided approval after this long;
	// the call is then refused (denied, reason approval).
	Timeout time.Duration
}

// ApprovalHTTPRule matches http calls by host, method and path.
type ApprovalHTTPRule struct {
	// Host is an exact host name (compared without case), an IP literal,
	// or "*.example.com" (any name below example.com).
	Host string
	// Methods, upper case; empty matches every method.
	Methods []string
	// PathPrefix, when set, matches only URL paths that start with it
	// ("/v1/payments"); empty matches every path.
	PathPrefix string
}

// Empty reports whether r asks approval for nothing.
func (r ApprovalRules) Empty() bool { return len(r.HTTP) == 0 && len(r.Models) == 0 }

var methodRE = regexp.MustCompile(`^[A-Z]{1,20}$`)

// ValidateApprovalRule checks a rule's shape; the error names the field.
func ValidateApprovalRule(r ApprovalHTTPRule) error {
	h := r.Host
	if h == "" {
		return fmt.Errorf("host is empty")
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err != nil {
		name := strings.TrimPrefix(h, "*.")
		if strings.Contains(name, "*") || !validHostName(name) || (strings.HasPrefix(h, "*.") && !strings.Contains(name, ".")) {
			return fmt.Errorf("host %q: want a host name, an IP literal or \"*.\" followed by a host name with a dot", h)
		}
	}
	for _, m := range r.Methods {
		if !methodRE.MatchString(m) {
			return fmt.Errorf("method %q: want an upper-case HTTP method", m)
		}
	}
	if r.PathPrefix != "" && !strings.HasPrefix(r.PathPrefix, "/") {
		return fmt.Errorf("path_prefix %q: want a path starting with /", r.PathPrefix)
	}
	return nil
}

// NeedsApproval reports whether req (a valid http or model call) matches
// one of the rules, and names what is to be approved for the approver: "POST
// https://api.example.com/v1/pay" (no query string) or "model
// main/gpt-4o" (the model as asked; empty: the endpoint's default).
func (r ApprovalRules) NeedsApproval(req *abi.CallRequest) (what string, ok bool) {
	switch {
	case req.Kind == abi.CallKindModel && req.Model != nil:
		if !slices.Contains(r.Models, req.Model.Endpoint) {
			return "", false
		}
		what = "model " + req.Model.Endpoint
		if req.Model.Model != "" {
			what += "/" + req.Model.Model
		}
		return what, true
	case req.Kind == abi.CallKindHTTP && req.HTTP != nil && len(r.HTTP) > 0:
		d, u, cerr := parseDest(req.HTTP.URL)
		if cerr != nil {
			return "", false // refused by the capabilities anyway
		}
		method := strings.ToUpper(req.HTTP.Method)
		if method == "" {
			method = "GET"
		}
		path := u.EscapedPath()
		if path == "" {
			path = "/"
		}
		for _, rule := range r.HTTP {
			if !rule.matchesHost(d.host) || (len(rule.Methods) > 0 && !slices.Contains(rule.Methods, method)) ||
				!strings.HasPrefix(path, rule.PathPrefix) {
				continue
			}
			return method + " " + d.scheme + "://" + u.Host + path, true
		}
	}
	return "", false
}

func (r ApprovalHTTPRule) matchesHost(host string) bool {
	h := strings.ToLower(strings.Trim(r.Host, "[]"))
	if a, err := netip.ParseAddr(h); err == nil {
		b, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == b.Unmap()
	}
	if suffix, ok := strings.CutPrefix(h, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return h == host
}
