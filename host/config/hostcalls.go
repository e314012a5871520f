package config

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/calls"
)

// secretNameRE is the rule for secret and model endpoint names: no dot
// (koanf's key delimiter) and nothing a "{{secret:NAME}}" placeholder
// could not carry.
var secretNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validateHostCalls checks models, secrets, the secrets key, host_calls
// and every capabilities block.
func (c Config) validateHostCalls() []error {
	var errs []error
	bad := func(key string, val any, why string) {
		errs = append(errs, &KeyError{Key: key, Value: val, Reason: why})
	}
	for _, name := range sortedKeys(c.Models) {
		m := c.Models[name]
		key := "models." + name
		if !secretNameRE.MatchString(name) {
			bad(key, name, "an endpoint name must match "+secretNameRE.String())
		}
		if m.Provider != calls.ProviderOpenAI && m.Provider != calls.ProviderAnthropic {
			bad(key+".provider", m.Provider, "must be openai or anthropic")
		}
		if u, err := url.Parse(m.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			bad(key+".base_url", m.BaseURL, "must be an absolute http(s) URL without user information")
		}
		if len(m.Models) == 0 {
			bad(key+".models", "[]", "list at least one model (the first is the default)")
		}
		for i, mm := range m.Models {
			if strings.TrimSpace(mm) == "" || slices.Index(m.Models, mm) != i {
				bad(fmt.Sprintf("%s.models[%d]", key, i), mm, "model names must be non-empty and unique")
			}
			if strings.Contains(mm, ",") {
				// An environment variable gives one string, not a list.
				bad(fmt.Sprintf("%s.models[%d]", key, i), mm, "a model name has no comma (from the environment, PADDOCK_MODELS__<NAME>__MODELS sets one model; list several in the config file)")
			}
		}
		if m.Secret != "" && !secretNameRE.MatchString(m.Secret) {
			bad(key+".secret", m.Secret, "must match "+secretNameRE.String())
		}
		if m.MaxTokens < 0 {
			bad(key+".max_tokens", m.MaxTokens, "must not be negative (0: 4096)")
		}
		if m.Timeout < 0 {
			bad(key+".timeout", m.Timeout, "must not be negative (0: host_calls.timeout)")
		}
	}
	for _, name := range sortedKeys(c.Secrets) {
		s := c.Secrets[name]
		key := "secrets." + name
		if r := c.checkQualified(name, secretNameRE.MatchString, secretNameRE.String()); r != "" {
			bad(key, name, "a secret name "+r)
		}
		if (s.Env == "") == (s.File == "") {
			bad(key, "…", "give exactly one of env and file")
		}
	}
	if c.SecretsKey != "" && c.SecretsKeyFile != "" {
		bad("secrets_key", "…", "give at most one of secrets_key and secrets_key_file")
	} else if _, err := c.SecretsKeyBytes(); err != nil {
		key := "secrets_key"
		if c.SecretsKeyFile != "" {
			key = "secrets_key_file"
		}
		bad(key, "…", err.Error())
	}
	if c.HostCalls.Timeout <= 0 {
		bad("host_calls.timeout", c.HostCalls.Timeout, "must be positive")
	}
	if c.HostCalls.MaxResponseBytes < 1024 || c.HostCalls.MaxResponseBytes > calls.MaxResponseBytesCeiling {
		bad("host_calls.max_response_bytes", c.HostCalls.MaxResponseBytes, fmt.Sprintf("must be between 1024 and %d (a body that size, base64 in a call result, fits abi.MaxCallResultBytes = %d)", calls.MaxResponseBytesCeiling, abi.MaxCallResultBytes))
	}
	errs = append(errs, c.Capabilities.validate("capabilities", c.Models)...)
	for i, a := range c.Agents {
		if a.Capabilities != nil {
			errs = append(errs, a.Capabilities.validate(fmt.Sprintf("agents[%d].capabilities", i), c.Models)...)
		}
	}
	return errs
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// validate checks a capabilities block: rules well-formed, endpoint names
// configured, secret names well-formed (a secret may be set through the
// API, so it need not be declared), limits not negative.
func (c Capabilities) validate(prefix string, models map[string]ModelEndpoint) []error {
	var errs []error
	bad := func(key string, val any, why string) {
		errs = append(errs, &KeyError{Key: prefix + "." + key, Value: val, Reason: why})
	}
	for i, r := range c.HTTP {
		if err := calls.ValidateRule(r.calls()); err != nil {
			bad(fmt.Sprintf("http[%d]", i), r.Host, err.Error())
		}
		for j, s := range r.Secrets {
			if !slices.Contains(c.Secrets, s) {
				bad(fmt.Sprintf("http[%d].secrets[%d]", i, j), s, "is not granted in "+prefix+".secrets")
			}
		}
	}
	for i, m := range c.Models {
		if _, ok := models[m]; !ok {
			bad(fmt.Sprintf("models[%d]", i), m, "is not a configured model endpoint (models: "+strings.Join(sortedKeys(models), ", ")+")")
		}
	}
	for i, s := range c.Secrets {
		if !secretNameRE.MatchString(s) {
			bad(fmt.Sprintf("secrets[%d]", i), s, "must match "+secretNameRE.String())
		}
	}
	for i, r := range c.Approval.HTTP {
		if err := calls.ValidateApprovalRule(r.calls()); err != nil {
			bad(fmt.Sprintf("approval.http[%d]", i), r.Host, err.Error())
		}
	}
	for i, m := range c.Approval.Models {
		if _, ok := models[m]; !ok {
			bad(fmt.Sprintf("approval.models[%d]", i), m, "is not a configured model endpoint (models: "+strings.Join(sortedKeys(models), ", ")+")")
		}
	}
	if c.Approval.Timeout < 0 {
		bad("approval.timeout", c.Approval.Timeout, "must not be negative (0: an approval waits for ever)")
	}
	l := c.Limits
	if l.CallsPerTurn < 0 || l.ResponseBytesPerTurn < 0 || l.TokensPerTurn < 0 || l.TokensPerDay < 0 {
		bad("limits", fmt.Sprintf("%+v", l), "limits must not be negative (0: no limit of its own)")
	}
	return errs
}

func (r ApprovalHTTPRule) calls() calls.ApprovalHTTPRule {
	return calls.ApprovalHTTPRule{Host: r.Host, Methods: slices.Clone(r.Methods), PathPrefix: r.PathPrefix}
}

func (r HTTPRule) calls() calls.HTTPRule {
	return calls.HTTPRule{Scheme: r.Scheme, Host: r.Host, Port: r.Port, Methods: slices.Clone(r.Methods),
		AllowPrivate: r.AllowPrivate, Secrets: slices.Clone(r.Secrets)}
}

// Calls converts the block to calls.Capabilities.
func (c Capabilities) Calls() calls.Capabilities {
	out := calls.Capabilities{
		Models:  slices.Clone(c.Models),
		Secrets: slices.Clone(c.Secrets),
		Limits: calls.Limits{CallsPerTurn: c.Limits.CallsPerTurn, ResponseBytesPerTurn: c.Limits.ResponseBytesPerTurn,
			TokensPerTurn: c.Limits.TokensPerTurn, TokensPerDay: c.Limits.TokensPerDay},
		Approval: calls.ApprovalRules{Models: slices.Clone(c.Approval.Models), Timeout: c.Approval.Timeout},
	}
	for _, r := range c.Approval.HTTP {
		out.Approval.HTTP = append(out.Approval.HTTP, r.calls())
	}
	for _, r := range c.HTTP {
		out.HTTP = append(out.HTTP, r.calls())
	}
	return out
}

// AgentCapabilities returns the named agent's effective capabilities:
// its agents[].capabilities if set, else the default capabilities.
func (c Config) AgentCapabilities(name string) calls.Capabilities {
	for _, a := range c.Agents {
		if a.Name == name && a.Capabilities != nil {
			return a.Capabilities.Calls()
		}
	}
	return c.Capabilities.Calls()
}

// ModelEndpoints converts models: for calls.Config.
func (c Config) ModelEndpoints() map[string]calls.Endpoint {
	out := make(map[string]calls.Endpoint, len(c.Models))
	for name, m := range c.Models {
		out[name] = calls.Endpoint{Provider: m.Provider, BaseURL: m.BaseURL, Models: slices.Clone(m.Models),
			Secret: m.Secret, MaxTokens: m.MaxTokens, Timeout: m.Timeout}
	}
	return out
}

// SecretSources converts secrets: for calls.SecretsConfig.
func (c Config) SecretSources() map[string]calls.SecretSource {
	out := make(map[string]calls.SecretSource, len(c.Secrets))
	for name, s := range c.Secrets {
		out[name] = calls.SecretSource{Env: s.Env, File: s.File}
	}
	return out
}

// SecretsKeyBytes returns the decoded secrets key (secrets_key, or the
// file secrets_key_file names), nil when neither is set. The error never
// holds the key.
func (c Config) SecretsKeyBytes() ([]byte, error) {
	k := c.SecretsKey
	if k == "" && c.SecretsKeyFile == "" {
		return nil, nil
	}
	if k == "" {
		b, err := readSmallFile(c.SecretsKeyFile, 4<<10)
		if err != nil {
			return nil, fmt.Errorf("secrets_key_file: %w", err)
		}
		k = strings.TrimSpace(string(b))
	}
	key, err := base64.StdEncoding.DecodeString(k)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("the secrets key must be 32 bytes in base64 (e.g. head -c32 /dev/urandom | base64)")
	}
	return key, nil
}

// OwnAPIAddrs returns the API's listen address(es) for
// calls.EgressConfig.OwnAddrs: the IP of listen, both loopback addresses
// for "localhost", the unspecified address for an empty host (":8080"),
// which Egress expands to every interface address. A host name other
// than localhost is resolved now; an error leaves it out.
func (c Config) OwnAPIAddrs() []netip.AddrPort {
	host, portStr, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return nil
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil
	}
	var addrs []netip.Addr
	switch {
	case host == "":
		addrs = []netip.Addr{netip.IPv4Unspecified()}
	case host == "localhost":
		addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	default:
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{a}
		} else if ips, err := net.LookupIP(host); err == nil {
			for _, ip := range ips {
				if a, ok := netip.AddrFromSlice(ip); ok {
					addrs = append(addrs, a.Unmap())
				}
			}
		}
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, netip.AddrPortFrom(a, uint16(port)))
	}
	return out
}
