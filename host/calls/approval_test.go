package calls

import (
	"testing"

	"github.com/paddock-dev/paddock/abi"
)

func TestNeedsApprovalMatchesHostMethodPathAndEndpoint(t *testing.T) {
	r := ApprovalRules{
		HTTP: []ApprovalHTTPRule{
			{Host: "pay.example.com", Methods: []string{"POST"}, PathPrefix: "/v1/charges"},
			{Host: "*.bank.example"},
			{Host: "127.0.0.1", PathPrefix: "/admin"},
		},
		Models: []string{"expensive"},
	}
	httpReq := func(method, url string) *abi.CallRequest {
		return &abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: method, URL: url}}
	}
	for _, tc := range []struct {
		req  *abi.CallRequest
		want string // "" = no approval needed
	}{
		{httpReq("POST", "https://pay.example.com/v1/charges/9?amount=5"), "POST https://pay.example.com/v1/charges/9"},
		{httpReq("post", "https://PAY.example.com/v1/charges"), "POST https://PAY.example.com/v1/charges"},
		{httpReq("GET", "https://pay.example.com/v1/charges"), ""},
		{httpReq("POST", "https://pay.example.com/v1/refunds"), ""},
		{httpReq("", "https://x.bank.example/"), "GET https://x.bank.example/"},
		{httpReq("DELETE", "https://bank.example/"), ""},
		{httpReq("GET", "http://127.0.0.1:8080/admin/users"), "GET http://127.0.0.1:8080/admin/users"},
		{httpReq("GET", "http://127.0.0.1:8080/public"), ""},
		{httpReq("GET", "not a url"), ""},
		{&abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "expensive", Model: "big"}}, "model expensive/big"},
		{&abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "expensive"}}, "model expensive"},
		{&abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "cheap"}}, ""},
	} {
		got, ok := r.NeedsApproval(tc.req)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("%+v: NeedsApproval = %q, %v; want %q", tc.req.HTTP, got, ok, tc.want)
		}
	}
	if _, ok := (ApprovalRules{}).NeedsApproval(httpReq("POST", "https://pay.example.com/v1/charges")); ok {
		t.Error("empty rules ask for approval")
	}
	for _, bad := range []ApprovalHTTPRule{{}, {Host: "*"}, {Host: "*.com"}, {Host: "a.b", Methods: []string{"get"}}, {Host: "a.b", PathPrefix: "x"}} {
		if ValidateApprovalRule(bad) == nil {
			t.Errorf("rule %+v accepted", bad)
		}
	}
}
