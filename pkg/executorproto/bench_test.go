package executorproto

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// The benchmarks move a 64 MiB payload in 1 MiB chunks; each has an io.Copy baseline over the
// same bytes into the same kind of sink, run beside it so the ratio is measured in one run.
const benchPayload = 64 << 20

// memSink copies what it is given into a reused buffer, as a socket's kernel buffer would.
type memSink struct{ buf []byte }

func (s *memSink) Write(p []byte) (int, error) {
	for written := 0; written < len(p); {
		written += copy(s.buf, p[written:])
	}
	return len(p), nil
}

// stream hides bytes.Reader's WriteTo, so sources behave like a socket: bytes arrive through
// Read calls, never as one 64 MiB slice.
type stream struct{ r io.Reader }

func (s stream) Read(p []byte) (int, error) { return s.r.Read(p) }

func newSink() *memSink { return &memSink{buf: make([]byte, DefaultChunkSize)} }

func benchBytes(b *testing.B) (payload, encoded []byte) {
	payload = bytes.Repeat([]byte("readie!"), benchPayload/7+1)[:benchPayload]
	var buf bytes.Buffer
	if err := WriteMessage(&buf, payload, DefaultChunkSize); err != nil {
		b.Fatal(err)
	}
	return payload, buf.Bytes()
}

func BenchmarkWriteMessage(b *testing.B) {
	payload, _ := benchBytes(b)
	sink := newSink()
	b.Run("WriteMessage", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			if err := WriteMessage(sink, payload, DefaultChunkSize); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-io.Copy", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			io.Copy(sink, bytes.NewReader(payload))
		}
	})
}

func BenchmarkReadMessage(b *testing.B) {
	payload, encoded := benchBytes(b)
	b.Run("ReadMessage", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ReadMessage(stream{bytes.NewReader(encoded)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Reading a stream of unknown length into memory is what io.Copy into a buffer does.
	b.Run("baseline-io.Copy", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			var buf bytes.Buffer
			io.Copy(&buf, stream{bytes.NewReader(encoded)})
		}
	})
}

func BenchmarkCopy(b *testing.B) {
	payload, encoded := benchBytes(b)
	sink := newSink()
	b.Run("Copy", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Copy(sink, stream{bytes.NewReader(encoded)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-io.Copy", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for b.Loop() {
			io.Copy(sink, stream{bytes.NewReader(encoded)})
		}
	})
}

// BenchmarkCopyUnixSocket relays a message from one Unix socket pair to another, as a worker
// forwards a request: the path that matters in production.
func BenchmarkCopyUnixSocket(b *testing.B) {
	_, encoded := benchBytes(b)
	pair := func() (net.Conn, net.Conn) {
		ln, err := net.Listen("unix", b.TempDir()+"/s")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn)
		go func() { c, _ := ln.Accept(); accepted <- c }()
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		return c, <-accepted
	}
	run := func(b *testing.B, relay func(dst io.Writer, src io.Reader) error) {
		inW, inR := pair()
		outW, outR := pair()
		defer func() { inW.Close(); inR.Close(); outW.Close(); outR.Close() }()
		b.SetBytes(int64(len(encoded)))
		b.ReportAllocs()
		for b.Loop() {
			done := make(chan error, 2)
			go func() { _, err := inW.Write(encoded); done <- err }()
			go func() { _, err := io.CopyN(io.Discard, outR, int64(len(encoded))); done <- err }()
			if err := relay(outW, inR); err != nil {
				b.Fatal(err)
			}
			for range 2 {
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("Copy", func(b *testing.B) {
		run(b, func(dst io.Writer, src io.Reader) error { _, err := Copy(dst, src); return err })
	})
	b.Run("baseline-io.Copy", func(b *testing.B) {
		run(b, func(dst io.Writer, src io.Reader) error {
			_, err := io.CopyN(dst, src, int64(len(encoded)))
			return err
		})
	})
}
