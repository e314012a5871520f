package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// A group commit lane's connection in pipeline mode (the extended query
// protocol's pipelining): the flusher sends batch k+1 while batch k
// commits, and a reader goroutine reads and answers batch k meanwhile.
// With pgx's batches (one connection per batch, results read before the
// next batch is built), the flusher's backend sat idle for about a fifth
// of the time: while the host read a batch's results, answered its
// callers, encoded the next batch and sent it.
//
// Each batch is its statements (Bind and Execute of a statement prepared
// on this connection), a Flush and a Sync: one implicit transaction, as a
// pgx batch is. The Flush makes the server send the statements' results
// before it commits, so that the reader learns the batch is committing and
// lets the flusher send the next one (pipe.room): at most one batch runs
// its statements while another commits, and each batch takes whatever
// queued until then. The server runs the batches one after another on one
// backend, so a lane's batches never wait for each other's row locks.
//
// A statement that fails makes the server skip the rest of its batch up to
// the Sync and roll it back; the next batch, already sent, runs as usual.
// A connection failure fails every batch in flight (each may have
// committed) and the next batch opens a new connection. pgx's pool holds
// none of this: the connection is taken out of it (hijacked) and owned by
// the group commit until the store closes.

// SQLSTATEs of a prepared statement that no longer serves: its plan's
// result type changed (a schema change), or it is gone.
const (
	codeCachedPlanChanged = "0A000"
	codeNoSuchStatement   = "26000"
)

// pipe is one pipelined connection of the group commit.
type pipe struct {
	conn    net.Conn
	pgx     *pgx.Conn // the hijacked handle: its type map and tracer
	typeMap *pgtype.Map
	tracer  pgx.BatchTracer   // nil when the pool's tracer is not one
	ptracer pgx.PrepareTracer // nil when the pool's tracer is not one

	// Flusher side.
	stmts  map[string]*pgconn.StatementDescription // prepared on this connection, by SQL
	nextID int
	wbuf   []byte
	eqb    pgx.ExtendedQueryBuilder
	idle   time.Time // when the last batch was sent (for the idle check)

	// sent carries the batches to the reader, in send order; the flusher
	// closes it when it gives the connection up.
	sent chan *sentBatch
	// room holds a token while the flusher may send a batch: none is
	// running its statements. The reader returns the token when a batch's
	// statements have answered (it is committing, or failed).
	room chan struct{}
	// stale is set by the reader when the server refused a prepared
	// statement as outdated; the flusher then prepares all again.
	stale atomic.Bool
	// writeErr is the first write that failed: the reason the reader's
	// reads fail after.
	writeErr atomic.Pointer[error]
	// dead is closed when the reader found the connection broken.
	dead chan struct{}
	// done is closed when the reader has returned.
	done chan struct{}
}

// sentBatch is a batch the reader answers: the requests' queries (or the
// statements to prepare, or neither for an idle check), their result
// formats, the deadline of the reads.
type sentBatch struct {
	reqs     []groupItem
	b        *pgx.Batch
	formats  [][]int16
	sds      []*pgconn.StatementDescription
	deadline time.Time
	// prepare: a batch of Parse and Describe messages, answered on
	// prepared (nil on success); no token taken.
	prepare  bool
	prepared chan error
}

// openPipe takes a connection out of s's pool for the group commit.
func (s *Store) openPipe(ctx context.Context) (*pipe, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	c := pc.Hijack()
	if err := c.PgConn().SyncConn(ctx); err != nil {
		_ = c.Close(ctx)
		return nil, err
	}
	hj, err := c.PgConn().Hijack()
	if err != nil {
		_ = c.Close(ctx)
		return nil, err
	}
	p := &pipe{
		conn: hj.Conn, pgx: c, typeMap: c.TypeMap(),
		stmts: map[string]*pgconn.StatementDescription{}, idle: time.Now(),
		sent: make(chan *sentBatch, 4), room: make(chan struct{}, 1),
		dead: make(chan struct{}), done: make(chan struct{}),
	}
	if t, ok := c.Config().Tracer.(pgx.BatchTracer); ok {
		p.tracer = t
	}
	if t, ok := c.Config().Tracer.(pgx.PrepareTracer); ok {
		p.ptracer = t
	}
	p.room <- struct{}{}
	go p.read(pgproto3.NewFrontend(hj.Conn, io.Discard))
	return p, nil
}

// isDead reports whether the reader found the connection broken.
func (p *pipe) isDead() bool {
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

// close gives the connection up once the reader has answered every batch
// sent: the flusher calls it, and sends nothing after.
func (p *pipe) close() {
	close(p.sent)
	<-p.done
	if !p.isDead() {
		_ = p.conn.SetWriteDeadline(time.Now().Add(time.Second))
		if buf, err := (&pgproto3.Terminate{}).Encode(nil); err == nil {
			_, _ = p.conn.Write(buf)
		}
	}
	_ = p.conn.Close()
}

// send sends reqs' statements (queued in b) as one batch, after preparing
// those this connection has not prepared yet, and hands it to the reader.
// The caller holds the room token. An error means nothing of the batch was
// sent: the caller answers the requests.
func (p *pipe) send(reqs []groupItem, b *pgx.Batch, deadline time.Time) error {
	if err := p.prepare(b, deadline); err != nil {
		return err
	}
	sb := &sentBatch{reqs: reqs, b: b, deadline: deadline,
		formats: make([][]int16, len(b.QueuedQueries)), sds: make([]*pgconn.StatementDescription, len(b.QueuedQueries))}
	buf := p.wbuf[:0]
	for i, q := range b.QueuedQueries {
		sd := p.stmts[q.SQL]
		if err := p.eqb.Build(p.typeMap, sd, q.Arguments); err != nil {
			return fmt.Errorf("encode %.40q: %w", q.SQL, err)
		}
		var err error
		if buf, err = (&pgproto3.Bind{PreparedStatement: sd.Name, ParameterFormatCodes: p.eqb.ParamFormats,
			Parameters: p.eqb.ParamValues, ResultFormatCodes: p.eqb.ResultFormats}).Encode(buf); err != nil {
			return fmt.Errorf("encode %.40q: %w", q.SQL, err)
		}
		buf, _ = (&pgproto3.Execute{}).Encode(buf)
		sb.sds[i], sb.formats[i] = sd, append([]int16(nil), p.eqb.ResultFormats...)
	}
	buf, _ = (&pgproto3.Flush{}).Encode(buf)
	buf, _ = (&pgproto3.Sync{}).Encode(buf)
	p.wbuf = buf
	if p.tracer != nil {
		ctx := p.tracer.TraceBatchStart(context.Background(), p.pgx, pgx.TraceBatchStartData{Batch: b})
		for _, q := range b.QueuedQueries {
			p.tracer.TraceBatchQuery(ctx, p.pgx, pgx.TraceBatchQueryData{SQL: q.SQL, Args: q.Arguments})
		}
		p.tracer.TraceBatchEnd(ctx, p.pgx, pgx.TraceBatchEndData{})
	}
	p.write(sb, buf)
	return nil
}

// write hands sb to the reader and writes buf. The reader must hold sb
// before the first byte goes out: a batch larger than the socket buffers
// gets its first answers while the rest is still being written, and a
// server whose answers nobody reads stops reading the batch. A write that
// fails breaks the connection (part of the batch may have gone out); the
// reader then answers sb with the write's error.
func (p *pipe) write(sb *sentBatch, buf []byte) {
	p.sent <- sb
	_ = p.conn.SetWriteDeadline(sb.deadline)
	if _, err := p.conn.Write(buf); err != nil {
		p.writeErr.CompareAndSwap(nil, &err)
		_ = p.conn.Close()
	}
}

// prepare prepares on this connection the statements of b it has not
// prepared yet: one round trip, which waits for the batches in flight.
func (p *pipe) prepare(b *pgx.Batch, deadline time.Time) error {
	if p.stale.Swap(false) {
		clear(p.stmts)
	}
	var todo []*pgconn.StatementDescription
	seen := map[string]bool{}
	for _, q := range b.QueuedQueries {
		if p.stmts[q.SQL] != nil || seen[q.SQL] {
			continue
		}
		seen[q.SQL] = true
		p.nextID++
		todo = append(todo, &pgconn.StatementDescription{Name: "paddock_gc_" + strconv.Itoa(p.nextID), SQL: q.SQL})
	}
	if len(todo) == 0 {
		return nil
	}
	var buf []byte
	for _, sd := range todo {
		buf, _ = (&pgproto3.Parse{Name: sd.Name, Query: sd.SQL}).Encode(buf)
		buf, _ = (&pgproto3.Describe{ObjectType: 'S', Name: sd.Name}).Encode(buf)
	}
	buf, _ = (&pgproto3.Sync{}).Encode(buf)
	if p.tracer != nil {
		// One round trip of its own, as pgx's prepare is.
		p.tracer.TraceBatchStart(context.Background(), p.pgx, pgx.TraceBatchStartData{})
	}
	sb := &sentBatch{prepare: true, sds: todo, deadline: deadline, prepared: make(chan error, 1)}
	p.write(sb, buf)
	err := <-sb.prepared
	if p.ptracer != nil {
		// Each statement as pgx traces its prepares, so that a tracer can
		// tell a statement prepared again from one prepared first.
		for _, sd := range todo {
			ctx := p.ptracer.TracePrepareStart(context.Background(), p.pgx, pgx.TracePrepareStartData{Name: sd.Name, SQL: sd.SQL})
			p.ptracer.TracePrepareEnd(ctx, p.pgx, pgx.TracePrepareEndData{Err: err})
		}
	}
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	for _, sd := range todo {
		p.stmts[sd.SQL] = sd
	}
	return nil
}

// ping checks, after the connection sat idle, that it still answers: a
// Sync alone, whose ReadyForQuery the reader waits for. pgx's pool checks
// a connection idle for more than a second before lending it the same
// way, so that a batch is not sent into a connection the server dropped
// meanwhile (a restart): its callers would not know whether it committed.
func (p *pipe) ping(deadline time.Time) error {
	buf, _ := (&pgproto3.Sync{}).Encode(nil)
	sb := &sentBatch{prepare: true, deadline: deadline, prepared: make(chan error, 1)}
	p.write(sb, buf)
	return <-sb.prepared
}

// read is the reader goroutine: it answers the batches in send order.
func (p *pipe) read(fe *pgproto3.Frontend) {
	defer close(p.done)
	var broken error
	for sb := range p.sent {
		if broken == nil {
			_ = p.conn.SetReadDeadline(sb.deadline)
			if broken = p.readBatch(fe, sb); broken != nil {
				// Broken before its callers hear of it, so that no batch
				// goes out on it after.
				close(p.dead)
				_ = p.conn.Close()
				if we := p.writeErr.Load(); we != nil {
					broken = *we
				}
				broken = fmt.Errorf("group commit connection: %w", broken)
			}
		}
		if broken != nil {
			p.answer(sb, nil, nil, nil, broken)
		}
	}
}

// readBatch reads one batch's answers and answers its requests; an error
// is the connection's (sb is not answered then).
func (p *pipe) readBatch(fe *pgproto3.Frontend, sb *sentBatch) (connErr error) {
	var refusal *pgconn.PgError
	results := make([]stmtResult, len(sb.sds))
	if sb.prepare {
		for _, sd := range sb.sds {
			if refusal != nil {
				break
			}
			var err error
			if refusal, err = p.readDescription(fe, sd); err != nil {
				return err
			}
		}
	} else {
	statements:
		for i := range sb.sds {
			r := &results[i]
			r.fields = fieldsWithFormats(sb.sds[i].Fields, sb.formats[i])
			for {
				msg, err := receive(fe)
				if err != nil {
					return err
				}
				switch msg := msg.(type) {
				case *pgproto3.BindComplete:
				case *pgproto3.DataRow:
					// The message's bytes are the frontend's until the
					// next Receive: one copy per row.
					n := 0
					for _, v := range msg.Values {
						n += len(v)
					}
					buf, row := make([]byte, 0, n), make([][]byte, len(msg.Values))
					for j, v := range msg.Values {
						if v != nil {
							buf = append(buf, v...)
							row[j] = buf[len(buf)-len(v) : len(buf) : len(buf)]
						}
					}
					r.rows = append(r.rows, row)
				case *pgproto3.CommandComplete:
					r.tag = pgconn.NewCommandTag(string(msg.CommandTag))
					continue statements
				case *pgproto3.EmptyQueryResponse:
					continue statements
				case *pgproto3.ErrorResponse:
					refusal = pgconn.ErrorResponseToPgError(msg)
					if endsConnection(refusal) {
						return refusal
					}
					break statements
				default:
					return fmt.Errorf("unexpected %T in a batch's results", msg)
				}
			}
		}
	}
	if !sb.prepare {
		// The statements have answered: the batch commits (or rolls
		// back); the flusher may send the next one.
		p.room <- struct{}{}
	}
	for {
		msg, err := receive(fe)
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.ReadyForQuery:
			if refusal != nil && (refusal.Code == codeCachedPlanChanged || refusal.Code == codeNoSuchStatement) {
				// A prepared statement no longer serves (a schema
				// change): prepare every statement again.
				p.stale.Store(true)
			}
			p.answer(sb, results, sb.b, refusal, nil)
			return nil
		case *pgproto3.ErrorResponse:
			// The commit failed.
			refusal = pgconn.ErrorResponseToPgError(msg)
			if endsConnection(refusal) {
				return refusal
			}
		}
		// Anything else before ReadyForQuery belongs to statements the
		// server skipped after a refusal: nothing to read from it.
	}
}

// readDescription reads a prepared statement's ParseComplete,
// ParameterDescription and RowDescription (or NoData) into sd; refusal is
// the server's error for it.
func (p *pipe) readDescription(fe *pgproto3.Frontend, sd *pgconn.StatementDescription) (refusal *pgconn.PgError, err error) {
	for {
		msg, err := receive(fe)
		if err != nil {
			return nil, err
		}
		switch msg := msg.(type) {
		case *pgproto3.ParseComplete:
		case *pgproto3.ParameterDescription:
			sd.ParamOIDs = append([]uint32(nil), msg.ParameterOIDs...)
		case *pgproto3.RowDescription:
			sd.Fields = make([]pgconn.FieldDescription, len(msg.Fields))
			for i, f := range msg.Fields {
				sd.Fields[i] = pgconn.FieldDescription{Name: string(f.Name), TableOID: f.TableOID,
					TableAttributeNumber: f.TableAttributeNumber, DataTypeOID: f.DataTypeOID,
					DataTypeSize: f.DataTypeSize, TypeModifier: f.TypeModifier, Format: f.Format}
			}
			return nil, nil
		case *pgproto3.NoData:
			return nil, nil
		case *pgproto3.ErrorResponse:
			pe := pgconn.ErrorResponseToPgError(msg)
			if endsConnection(pe) {
				return nil, pe
			}
			return pe, nil
		default:
			return nil, fmt.Errorf("unexpected %T in a prepare's results", msg)
		}
	}
}

// answer answers sb: a prepare or a ping on its channel; a batch's
// requests with their results (refused: the server refused a statement;
// connErr: the connection failed).
func (p *pipe) answer(sb *sentBatch, results []stmtResult, b *pgx.Batch, refusal *pgconn.PgError, connErr error) {
	if sb.prepare {
		switch {
		case connErr != nil:
			sb.prepared <- connErr
		case refusal != nil:
			sb.prepared <- refusal
		default:
			sb.prepared <- nil
		}
		return
	}
	if connErr != nil {
		// Whether the batch committed is unknown. The room token goes
		// back with it, unless the statements had answered already.
		select {
		case p.room <- struct{}{}:
		default:
		}
		for _, r := range sb.reqs {
			r.settle(false, connErr)
		}
		return
	}
	if refusal != nil {
		for _, r := range sb.reqs {
			r.settle(true, nil)
		}
		return
	}
	br := &bufferedResults{typeMap: p.typeMap, results: results}
	// As pgx's batches: the callbacks in order, none after one failed.
	var cbErr error
	for _, q := range b.QueuedQueries {
		if q.Fn != nil {
			cbErr = q.Fn(br)
		} else {
			_, cbErr = br.Exec()
		}
		if cbErr != nil {
			cbErr = fmt.Errorf("group commit of %d requests: %w", len(sb.reqs), cbErr)
			break
		}
	}
	for _, r := range sb.reqs {
		r.settle(false, cbErr)
	}
}

// receive returns the next message that answers a request, skipping the
// asynchronous ones.
func receive(fe *pgproto3.Frontend) (pgproto3.BackendMessage, error) {
	for {
		msg, err := fe.Receive()
		if err != nil {
			return nil, err
		}
		switch msg.(type) {
		case *pgproto3.ParameterStatus, *pgproto3.NoticeResponse, *pgproto3.NotificationResponse:
			continue
		}
		return msg, nil
	}
}

// fieldsWithFormats returns the statement's fields with the result formats
// its Bind asked for.
func fieldsWithFormats(fields []pgconn.FieldDescription, formats []int16) []pgconn.FieldDescription {
	out := make([]pgconn.FieldDescription, len(fields))
	copy(out, fields)
	for i := range out {
		switch {
		case len(formats) == 1:
			out[i].Format = formats[0]
		case i < len(formats):
			out[i].Format = formats[i]
		default:
			out[i].Format = pgtype.TextFormatCode
		}
	}
	return out
}

// stmtResult is one statement's answer, read in full.
type stmtResult struct {
	fields []pgconn.FieldDescription
	rows   [][][]byte
	tag    pgconn.CommandTag
}

// bufferedResults are a batch's results as pgx.BatchResults, for the
// queued queries' callbacks: each call takes the next statement's.
type bufferedResults struct {
	typeMap *pgtype.Map
	results []stmtResult
	next    int
}

var _ pgx.BatchResults = (*bufferedResults)(nil)

func (br *bufferedResults) take() (*stmtResult, error) {
	if br.next >= len(br.results) {
		return nil, errors.New("no more results in batch")
	}
	r := &br.results[br.next]
	br.next++
	return r, nil
}

func (br *bufferedResults) Exec() (pgconn.CommandTag, error) {
	r, err := br.take()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return r.tag, nil
}

func (br *bufferedResults) Query() (pgx.Rows, error) {
	r, err := br.take()
	if err != nil {
		return &bufferedRows{err: err, closed: true}, err
	}
	return &bufferedRows{typeMap: br.typeMap, r: r, i: -1}, nil
}

func (br *bufferedResults) QueryRow() pgx.Row {
	rows, _ := br.Query()
	return bufferedRow{rows.(*bufferedRows)}
}

func (br *bufferedResults) Close() error { return nil }
func (br *bufferedResults) Tx() pgx.Tx   { return nil }

// bufferedRows are one statement's rows as pgx.Rows.
type bufferedRows struct {
	typeMap *pgtype.Map
	r       *stmtResult
	i       int
	err     error
	closed  bool
}

var _ pgx.Rows = (*bufferedRows)(nil)

func (rs *bufferedRows) Close() { rs.closed = true }
func (rs *bufferedRows) Err() error {
	return rs.err
}

func (rs *bufferedRows) CommandTag() pgconn.CommandTag {
	if rs.r == nil {
		return pgconn.CommandTag{}
	}
	return rs.r.tag
}

func (rs *bufferedRows) FieldDescriptions() []pgconn.FieldDescription {
	if rs.r == nil {
		return nil
	}
	return rs.r.fields
}

func (rs *bufferedRows) Next() bool {
	if rs.closed || rs.err != nil || rs.r == nil {
		return false
	}
	rs.i++
	if rs.i >= len(rs.r.rows) {
		rs.closed = true
		return false
	}
	return true
}

func (rs *bufferedRows) Scan(dest ...any) error {
	if rs.r == nil || rs.i < 0 || rs.i >= len(rs.r.rows) {
		return errors.New("scan without a current row")
	}
	if err := pgx.ScanRow(rs.typeMap, rs.r.fields, rs.r.rows[rs.i], dest...); err != nil {
		rs.err = err
		rs.closed = true
		return err
	}
	return nil
}

func (rs *bufferedRows) Values() ([]any, error) {
	if rs.r == nil || rs.i < 0 || rs.i >= len(rs.r.rows) {
		return nil, errors.New("values without a current row")
	}
	row := rs.r.rows[rs.i]
	out := make([]any, len(row))
	for j, fd := range rs.r.fields {
		if row[j] == nil {
			continue
		}
		if dt, ok := rs.typeMap.TypeForOID(fd.DataTypeOID); ok {
			v, err := dt.Codec.DecodeValue(rs.typeMap, fd.DataTypeOID, fd.Format, row[j])
			if err != nil {
				return nil, err
			}
			out[j] = v
		} else if fd.Format == pgtype.TextFormatCode {
			out[j] = string(row[j])
		} else {
			out[j] = append([]byte(nil), row[j]...)
		}
	}
	return out, nil
}

func (rs *bufferedRows) RawValues() [][]byte {
	if rs.r == nil || rs.i < 0 || rs.i >= len(rs.r.rows) {
		return nil
	}
	return rs.r.rows[rs.i]
}

func (rs *bufferedRows) Conn() *pgx.Conn      { return nil }
func (rs *bufferedRows) TypeMap() *pgtype.Map { return rs.typeMap }

// bufferedRow is a statement's first row as pgx.Row (pgx's QueryRow:
// ErrNoRows without one).
type bufferedRow struct{ rs *bufferedRows }

func (r bufferedRow) Scan(dest ...any) error {
	rs := r.rs
	defer rs.Close()
	if rs.err != nil {
		return rs.err
	}
	if !rs.Next() {
		if rs.err != nil {
			return rs.err
		}
		return pgx.ErrNoRows
	}
	return rs.Scan(dest...)
}
