package output

import (
	"io"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Progress reports bytes done of total on a transfer, at most once per Every, and once at the
// end, through Report (a log line on stderr, in text or JSON); Layer, if set, hears of each
// layer a push uploads the same way.
type Progress struct {
	What   string
	Every  time.Duration
	Report func(what string, done, total int64)
	Layer  func(layer string, done, total int64)

	once sync.Once
	ch   chan v1.Update
	wg   sync.WaitGroup
	last int64
}

// updates is the channel go-containerregistry reports to; nil on a nil Progress.
func (p *Progress) updates() chan<- v1.Update {
	if p == nil {
		return nil
	}
	p.once.Do(func() {
		p.ch = make(chan v1.Update, 16)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			var next time.Time
			for u := range p.ch {
				p.last = u.Total
				if now := time.Now(); now.After(next) || u.Complete == u.Total {
					next = now.Add(p.Every)
					p.Report(p.What, u.Complete, u.Total)
				}
			}
		}()
	})
	return p.ch
}

// done waits for the last report (go-containerregistry closes the channel when it is done).
func (p *Progress) done() {
	if p != nil && p.ch != nil {
		p.wg.Wait()
	}
}

// layerProgress is a layer that reports the bytes of it read for an upload: per layer, as
// image tools show a push, throttled to one report a second, and one at the end.
type layerProgress struct {
	v1.Layer
	name   string
	report func(name string, done, total int64)
}

func (l *layerProgress) Compressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Compressed()
	if err != nil {
		return nil, err
	}
	total, _ := l.Layer.Size()
	return &progressReader{ReadCloser: rc, name: l.name, total: total, report: l.report}, nil
}

type progressReader struct {
	io.ReadCloser
	name        string
	done, total int64
	next        time.Time
	report      func(name string, done, total int64)
}

func (r *progressReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.done += int64(n)
	if now := time.Now(); now.After(r.next) || err == io.EOF {
		r.next = now.Add(time.Second)
		r.report(r.name, r.done, r.total)
	}
	return n, err
}
