package calls

import (
	"context"
	"fmt"
	"sync"
)

// Budget counts one attempt's host calls against the agent's Limits:
// calls, response bytes and tokens per turn, and tokens per day through
// the integrator's TokensToday. Make one per attempt (a retried attempt
// starts afresh; its replayed calls are the journal's business). It is
// safe for concurrent use.
type Budget struct {
	limits      Limits
	tokensToday func(ctx context.Context) (int64, error)

	mu        sync.Mutex
	calls     int
	respBytes int64
	tokens    int64
}

// NewBudget returns a budget for one attempt. tokensToday, when set,
// returns the agent's model tokens (input + output) of the current UTC
// day, every completed call included (the integrator sums
// Outcome.Usage); it is consulted only when limits.TokensPerDay > 0.
func NewBudget(limits Limits, tokensToday func(ctx context.Context) (int64, error)) *Budget {
	return &Budget{limits: limits, tokensToday: tokensToday}
}

// Calls returns the calls counted so far.
func (b *Budget) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

// ResponseBytes returns the response bytes counted so far.
func (b *Budget) ResponseBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.respBytes
}

// Tokens returns the model tokens counted so far.
func (b *Budget) Tokens() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}

// beginCall counts a call (denied calls_per_turn past the limit; a
// refused call is not counted).
func (b *Budget) beginCall() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limits.CallsPerTurn > 0 && b.calls >= b.limits.CallsPerTurn {
		return denied(ReasonCallsPerTurn, "the turn made its %d host calls (limits.calls_per_turn)", b.limits.CallsPerTurn)
	}
	b.calls++
	return nil
}

// responseCap returns the byte cap of the next call: max, lowered to what
// remains of the turn's response bytes (denied response_bytes_per_turn
// when nothing remains). With a per-turn limit the cap is reserved at
// once, so concurrent calls of one turn share the remainder instead of
// each getting all of it; settleResponseBytes gives back what the call
// did not use.
func (b *Budget) responseCap(maxBytes int64) (capN, reserved int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limits.ResponseBytesPerTurn <= 0 {
		return maxBytes, 0, nil
	}
	rem := b.limits.ResponseBytesPerTurn - b.respBytes
	if rem <= 0 {
		return 0, 0, denied(ReasonResponseBytesPerTurn, "the turn received its %d response bytes (limits.response_bytes_per_turn)", b.limits.ResponseBytesPerTurn)
	}
	capN = min(maxBytes, rem)
	b.respBytes += capN
	return capN, capN, nil
}

// settleResponseBytes counts a call's n response bytes in place of the
// reserved ones.
func (b *Budget) settleResponseBytes(reserved, n int64) {
	b.mu.Lock()
	b.respBytes += n - reserved
	b.mu.Unlock()
}

func (b *Budget) addTokens(n int64) {
	b.mu.Lock()
	b.tokens += n
	b.mu.Unlock()
}

// tokenReason names the limit that binds the tokens of the next call:
// tokens_per_turn when the turn has one, else tokens_per_day.
func (b *Budget) tokenReason() string {
	if b != nil && b.limits.TokensPerTurn > 0 {
		return ReasonTokensPerTurn
	}
	return ReasonTokensPerDay
}

// tokenCap returns how many tokens the next model call may use (0 = no
// limit), or a denial (tokens_per_turn, tokens_per_day).
func (b *Budget) tokenCap(ctx context.Context) (int64, error) {
	b.mu.Lock()
	used := b.tokens
	b.mu.Unlock()
	var capN int64
	if l := b.limits.TokensPerTurn; l > 0 {
		if used >= l {
			return 0, denied(ReasonTokensPerTurn, "the turn used its %d tokens (limits.tokens_per_turn)", l)
		}
		capN = l - used
	}
	if l := b.limits.TokensPerDay; l > 0 && b.tokensToday != nil {
		today, err := b.tokensToday(ctx)
		if err != nil {
			return 0, fmt.Errorf("tokens today: %w", err)
		}
		if today >= l {
			return 0, denied(ReasonTokensPerDay, "the agent used its %d tokens of the day (limits.tokens_per_day)", l)
		}
		if capN == 0 || l-today < capN {
			capN = l - today
		}
	}
	return capN, nil
}
