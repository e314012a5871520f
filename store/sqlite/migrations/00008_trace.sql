-- The trace context of an event (docs/DESIGN.md "Tracing").
--
-- actor_events.traceparent: the W3C traceparent of the signal's acceptance
-- ("00-<trace id>-<span id>-<flags>", 55 bytes), NULL when the signal came
-- without one and tracing was off. The turn's spans are started as its
-- children, so that they join the caller's trace, on whichever host and
-- however late the turn runs. Nullable without a default: no table rebuild.

-- +goose Up
ALTER TABLE actor_events ADD COLUMN traceparent TEXT;

-- +goose Down
ALTER TABLE actor_events DROP COLUMN traceparent;
