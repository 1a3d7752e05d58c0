package executorproto

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve accepts one connection on a fresh Unix socket and runs handle on it.
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "executor.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		handle(conn)
	}()
	return path
}

func TestDialWaitsForSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "executor.sock")
	go func() {
		time.Sleep(100 * time.Millisecond)
		ln, err := net.Listen("unix", path)
		if err != nil {
			return
		}
		conn, err := ln.Accept()
		if err == nil {
			conn.Close()
		}
		ln.Close()
	}()
	conn, err := (&Dialer{Timeout: 10 * time.Second}).Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

func TestDialTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "never.sock")
	start := time.Now()
	_, err := (&Dialer{Timeout: 150 * time.Millisecond}).Dial(context.Background(), path)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Dial = %v; want a deadline error naming %s", err, path)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("Dial took %s with a 150ms budget", elapsed)
	}
}

func TestCallRoundTrip(t *testing.T) {
	path := serve(t, func(conn net.Conn) {
		for {
			req, err := ReadMessage(conn)
			if err != nil {
				return
			}
			if err := WriteMessage(conn, bytes.ToUpper(req), 3); err != nil {
				return
			}
		}
	})
	conn, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, req := range []string{"hello", "", "again on the same connection"} {
		resp, err := Call(ctx, conn, []byte(req))
		if err != nil || string(resp) != strings.ToUpper(req) {
			t.Fatalf("Call(%q) = %q, %v", req, resp, err)
		}
	}
}

func TestCallTruncatedResponse(t *testing.T) {
	path := serve(t, func(conn net.Conn) {
		if _, err := ReadMessage(conn); err != nil {
			return
		}
		conn.Write(append(header(10), "short"...)) // then the executor dies
	})
	conn, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := Call(context.Background(), conn, []byte("x")); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Call = %v; want ErrTruncated", err)
	}
}

func TestCallHonoursDeadlineAndCancel(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	for _, name := range []string{"deadline", "cancel"} {
		t.Run(name, func(t *testing.T) {
			path := serve(t, func(conn net.Conn) { <-block })
			conn, err := Dial(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			want := context.DeadlineExceeded
			if name == "cancel" {
				ctx, cancel = context.WithCancel(context.Background())
				time.AfterFunc(150*time.Millisecond, cancel)
				want = context.Canceled
			}
			defer cancel()
			if _, err := Call(ctx, conn, []byte("x")); !errors.Is(err, want) {
				t.Fatalf("Call = %v; want %v", err, want)
			}
		})
	}
}

// TestCallCancelledAsItAnswers: the context is cancelled just as the response arrives (the
// server cancels it after writing). When that call succeeds, the next call on the same
// connection works: a late cancellation callback must not leave a past deadline behind.
func TestCallCancelledAsItAnswers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "executor.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cancels := make(chan context.CancelFunc, 1)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				for {
					req, err := ReadMessage(conn)
					if err != nil {
						return
					}
					if err := WriteMessage(conn, req, DefaultChunkSize); err != nil {
						return
					}
					select {
					case cancel := <-cancels:
						cancel()
					default:
					}
				}
			}()
		}
	}()
	succeeded := 0
	for i := 0; succeeded < 200 && i < 5000; i++ {
		conn, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancels <- cancel
		_, err = Call(ctx, conn, []byte("cancelled as it answers"))
		cancel()
		if err == nil { // a call cut short leaves the stream mid-message: only a good one counts
			succeeded++
			if resp, err := Call(context.Background(), conn, []byte("next")); err != nil || string(resp) != "next" {
				t.Fatalf("the call after a cancelled one that succeeded = %q, %v", resp, err)
			}
		}
		conn.Close()
		select {
		case <-cancels:
		default:
		}
	}
	if succeeded == 0 {
		t.Fatal("no call succeeded: the test checked nothing")
	}
}

// TestDialTimeoutNamesTheStep: a dial bounded by its caller's step says which step ran out.
func TestDialTimeoutNamesTheStep(t *testing.T) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), 50*time.Millisecond, errors.New("smoke of pandas exceeded its timeout of 50ms"))
	defer cancel()
	_, err := Dial(ctx, filepath.Join(t.TempDir(), "never.sock"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "smoke of pandas exceeded its timeout of 50ms") {
		t.Fatalf("Dial = %v; want the caller's cause, still matching DeadlineExceeded", err)
	}
}

// TestCallResponseLimit: a response over the Caller's limit fails with ErrMessageTooLarge
// naming it; the default Caller takes one under DefaultReadLimit.
func TestCallResponseLimit(t *testing.T) {
	response := bytes.Repeat([]byte("r"), 2<<20)
	for _, tc := range []struct {
		limit int64
		ok    bool
	}{{1 << 20, false}, {2 << 20, true}, {0, true}} {
		path := serve(t, func(conn net.Conn) {
			if _, err := ReadMessage(conn); err == nil {
				WriteMessage(conn, response, DefaultChunkSize)
			}
		})
		conn, err := Dial(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := (&Caller{MaxResponseSize: tc.limit}).Call(context.Background(), conn, []byte("request"))
		conn.Close()
		if tc.ok && (err != nil || !bytes.Equal(got, response)) {
			t.Errorf("limit %d: %d bytes, %v", tc.limit, len(got), err)
		}
		if !tc.ok && (!errors.Is(err, ErrMessageTooLarge) || !strings.Contains(err.Error(), "more than 1048576 bytes")) {
			t.Errorf("limit %d: %v, want ErrMessageTooLarge naming the limit", tc.limit, err)
		}
	}
}
