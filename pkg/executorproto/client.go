package executorproto

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// DefaultDialTimeout is how long Dial waits for the executor's socket to appear and accept.
const DefaultDialTimeout = 60 * time.Second

// Dialer connects to an executor's socket, retrying while the executor starts or restores.
type Dialer struct {
	// Timeout bounds the whole dial; zero means DefaultDialTimeout. A context deadline that
	// comes sooner wins.
	Timeout time.Duration
	// RetryInterval is the pause between attempts; zero means 2 ms, short because a restored
	// executor binds its socket within milliseconds and every pause is added to restore latency.
	RetryInterval time.Duration
}

// Dial connects to the executor socket at socketPath with the default Dialer.
func Dial(ctx context.Context, socketPath string) (net.Conn, error) {
	var d Dialer
	return d.Dial(ctx, socketPath)
}

// Dial retries until socketPath exists and accepts a connection, the timeout expires or ctx
// ends. The error names the socket and the last reason it refused.
func (d *Dialer) Dial(ctx context.Context, socketPath string) (net.Conn, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	interval := d.RetryInterval
	if interval <= 0 {
		interval = 2 * time.Millisecond
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("%w: the dial's own limit of %s", context.DeadlineExceeded, timeout))
	defer cancel()
	var nd net.Dialer
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		conn, err := nd.DialContext(ctx, "unix", socketPath)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() == nil {
			timer.Reset(interval)
			select {
			case <-ctx.Done():
			case <-timer.C:
				continue
			}
		}
		// The cause says which limit ran out (the caller's step, or the dial's own); ctx.Err()
		// keeps the error matchable with errors.Is.
		return nil, fmt.Errorf("executorproto: dial %s: no executor after %s: %w (last error: %v)",
			socketPath, time.Since(start).Round(time.Millisecond), causeOf(ctx), err)
	}
}

// causeOf returns ctx's cause, still matching ctx.Err() with errors.Is.
func causeOf(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ctx.Err()) {
		return cause
	}
	return fmt.Errorf("%w: %w", cause, ctx.Err())
}

// Caller makes calls with settings; the zero Caller is Call's.
type Caller struct {
	// MaxResponseSize bounds the response read into memory; zero means DefaultReadLimit, and
	// a negative value or more than MaxMessageSize means MaxMessageSize. A larger response fails with
	// ErrMessageTooLarge (checked before it is allocated) and leaves conn unusable.
	MaxResponseSize int64
}

// Call sends request as one message on conn and returns the payload of the one response
// message, of at most DefaultReadLimit bytes, with the zero Caller.
func Call(ctx context.Context, conn net.Conn, request []byte) ([]byte, error) {
	var c Caller
	return c.Call(ctx, conn, request)
}

// Call sends request as one message on conn and returns the payload of the one response
// message. It honours ctx's deadline and cancellation; a connection the executor closes before
// the response's terminator gives an error matching ErrTruncated, a response over
// MaxResponseSize one matching ErrMessageTooLarge.
func (c *Caller) Call(ctx context.Context, conn net.Conn, request []byte) ([]byte, error) {
	limit := c.MaxResponseSize
	if limit == 0 {
		limit = DefaultReadLimit
	}
	deadline, _ := ctx.Deadline() // zero, no deadline, when ctx has none
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("executorproto: call: %w", err)
	}
	// Cancellation unblocks the I/O by moving the deadline to now. The callback may already be
	// running when the call returns: wait for it before clearing the deadline, or it would set
	// a past deadline afterwards and break the next call on this connection.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		conn.SetDeadline(time.Unix(1, 0))
	})
	defer func() {
		if !stop() {
			<-fired
		}
		conn.SetDeadline(time.Time{})
	}()

	if err := WriteMessage(conn, request, DefaultChunkSize); err != nil {
		return nil, callError(ctx, "send request", err)
	}
	response, err := ReadMessageLimit(conn, limit)
	if err != nil {
		return nil, callError(ctx, "read response", err)
	}
	return response, nil
}

func callError(ctx context.Context, step string, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if _, hasDeadline := ctx.Deadline(); hasDeadline || ctx.Err() != nil {
			// The connection's deadline is ctx's, so ctx is done now or a moment from now.
			<-ctx.Done()
			return fmt.Errorf("executorproto: call: %s: %w", step, causeOf(ctx))
		}
	}
	return fmt.Errorf("executorproto: call: %s: %w", step, err)
}
