-- paddock_check lets a statement refuse its transaction from inside the
-- database: a hot-path batch that ends in COMMIT (one round trip fewer per
-- turn) cannot let the client veto it after reading the results, so its
-- guards raise instead. SQLSTATE PD001; the message says what failed.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION paddock_check(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'PD001', MESSAGE = what;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION paddock_check(boolean, text);
