// Package calls is the host side of host calls (abi/call.go; docs/DESIGN.md
// "Host calls and the journal", invariants 12 and 13), without the journal: it
// checks a call against the calling agent's Capabilities and the turn's
// Budget, fills secrets into outbound requests after the destination check,
// and performs the call — an http call through Egress, the host's guarded
// outbound client, or a model call through the provider adapter of a named
// endpoint (OpenAI-compatible chat completions or Anthropic's Messages
// API). The Executor ties these together; the integrator records its
// Outcomes in the journal.
//
// Nothing is granted by default: the zero Capabilities deny every call.
// A secret's value is never part of an error, a log line, an Outcome or a
// result: every error string and every response is scrubbed of the values
// filled into its request (invariant 13).
//
// Why adapters over net/http rather than the providers' Go SDKs
// (openai-go, anthropic-sdk-go): both SDKs retry on their own (a hidden
// second request would be a second paid call that the journal never
// recorded, against invariant 12's "never sends that request again"), they
// build and send the request themselves (the egress check must see every
// dial and every redirect, and secrets must be filled after that check and
// scrubbed from every error), and the journal needs the exact request bytes
// for its digest. The two wire protocols the host speaks — chat completions
// and Messages, each with its SSE stream — are about 250 lines each
// (openai.go, anthropic.go, sse.go), tested against real HTTP servers that
// speak them.
package calls
