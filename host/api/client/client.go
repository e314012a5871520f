// Package client is the Go client of Paddock's HTTP JSON API (package
// host/api, described in host/api/openapi.yaml): one typed method per
// route, context first. An error answer of the API is returned as an
// *Error carrying the HTTP status and the API's stable error code; a
// transport failure is returned wrapped (errors.As finds its *url.Error).
//
//	c := client.New("http://127.0.0.1:8080", client.WithToken(tok))
//	s, err := c.CreateSession(ctx, "notes", client.SessionRequest{Key: "k1"})
//	r, err := c.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "hello"})
//	if client.IsNotFound(err) { … }
//
// A Client holds no mutable state and may be used by many goroutines.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client calls one Paddock host's API. Build it with New; the zero value
// is not usable.
type Client struct {
	base      string
	token     string
	namespace string
	userAgent string
	hc        *http.Client
}

// Option configures a Client in New.
type Option func(*Client)

// WithToken sends "Authorization: Bearer <token>" with every request (the
// host's api.auth_token). An empty token sends no header.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithNamespace makes every request act in namespace ns (the query
// parameter ?namespace=, docs/DESIGN.md "Namespaces"). Empty: none named,
// the host's "default".
func WithNamespace(ns string) Option { return func(c *Client) { c.namespace = ns } }

// Namespace returns the namespace given to WithNamespace ("" for none).
func (c *Client) Namespace() string { return c.namespace }

// url returns the address of path, with ?namespace= when the client names
// one.
func (c *Client) url(path string) string {
	if c.namespace == "" {
		return c.base + path
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return c.base + path + sep + "namespace=" + url.QueryEscape(c.namespace)
}

// WithHTTPClient sends the requests with hc (its timeout and transport)
// instead of http.DefaultClient. A nil hc keeps the default.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent sets the User-Agent header of every request (default: Go's).
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a client of the API at baseURL, the host's address such as
// "http://127.0.0.1:8080" (a trailing slash is ignored; the /v1 prefix is
// added by the methods).
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: http.DefaultClient}
	for _, o := range opts {
		o(c)
	}
	return c
}

// BaseURL returns the address given to New, without a trailing slash.
func (c *Client) BaseURL() string { return c.base }

// CallOption asks one call for more of the answer than its typed result.
type CallOption func(*call)

type call struct {
	raw    *json.RawMessage
	status *int
}

// Raw stores the body of a successful answer, as the server sent it, in
// *dst (for printing it unchanged, e.g. `paddock … --output json`).
func Raw(dst *json.RawMessage) CallOption { return func(o *call) { o.raw = dst } }

// Status stores the HTTP status of a successful answer in *dst (e.g. 201
// for a created plugin worker, 200 for one registered again).
func Status(dst *int) CallOption { return func(o *call) { o.status = dst } }

// do sends one request: body (if non-nil) with contentType, and decodes a
// 2xx JSON answer into out (if non-nil). A non-2xx answer is an *Error.
func (c *Client) do(ctx context.Context, method, path string, body []byte, contentType string, out any, opts []CallOption) error {
	if body == nil {
		return c.doStream(ctx, method, path, nil, 0, contentType, out, opts)
	}
	return c.doStream(ctx, method, path, bytes.NewReader(body), int64(len(body)), contentType, out, opts)
}

// doStream is do with a body read from body (if non-nil), size bytes long:
// it is streamed, never held in memory whole.
func (c *Client) doStream(ctx context.Context, method, path string, body io.Reader, size int64, contentType string, out any, opts []CallOption) error {
	var o call
	for _, f := range opts {
		f(&o)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), body)
	if err != nil {
		return fmt.Errorf("paddock api %s %s: %w", method, path, err)
	}
	if body != nil {
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("paddock api %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("paddock api %s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp.StatusCode, resp.Header, data)
	}
	if o.raw != nil {
		*o.raw = data
	}
	if o.status != nil {
		*o.status = resp.StatusCode
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("paddock api %s %s: decoding the answer (HTTP %d): %w", method, path, resp.StatusCode, err)
		}
	}
	return nil
}

// doJSON sends in (if non-nil) as a JSON body.
func (c *Client) doJSON(ctx context.Context, method, path string, in, out any, opts []CallOption) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("paddock api %s %s: encoding the request: %w", method, path, err)
		}
		body = b
	}
	return c.do(ctx, method, path, body, "application/json", out, opts)
}

// esc escapes one path segment.
func esc(s string) string { return url.PathEscape(s) }

func agentPath(agent string) string { return "/v1/agents/" + esc(agent) }

func sessionPath(agent, session string) string {
	return agentPath(agent) + "/sessions/" + esc(session)
}

func eventPath(agent, session string, id int64) string {
	return fmt.Sprintf("%s/events/%d", sessionPath(agent, session), id)
}

// query builds "?k=v&…" from pairs, leaving out empty values ("" when
// all are empty).
func query(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}
