//go:build tools

// Package main pins dependencies until the code that uses them lands.
package main

import (
	_ "github.com/cenkalti/backoff/v5"
	_ "github.com/getkin/kin-openapi/openapi3"
	_ "github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/knadh/koanf/parsers/yaml"
	_ "github.com/knadh/koanf/providers/confmap"
	_ "github.com/knadh/koanf/providers/env/v2"
	_ "github.com/knadh/koanf/providers/file"
	_ "github.com/knadh/koanf/providers/posflag"
	_ "github.com/knadh/koanf/v2"
	_ "github.com/pressly/goose/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/spf13/cobra"
	_ "github.com/tetratelabs/wazero"
	_ "modernc.org/sqlite"
)
