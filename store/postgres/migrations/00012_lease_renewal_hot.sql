-- A lease renewal is a heap-only (HOT) update: no index covers
-- activations.lease_expires_at any more. The watchdog's index on it made
-- every renewal of every live activation (each ttl/3) write a new entry in
-- each of the table's indexes, which bloated the ones the turn path reads
-- (by activation uid, by session). ExpiredActivations now reads the live
-- activations through activations_live (one entry per live activation)
-- and filters by the lease: O(live activations) per watchdog scan instead
-- of four index writes per activation per renewal.

-- +goose Up
DROP INDEX activations_lease;

-- +goose Down
CREATE INDEX activations_lease ON activations (lease_expires_at)
    WHERE state IN ('starting', 'active', 'draining');
