package demo

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// proc is a worker process driven over JSON lines.
type proc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	mu      sync.Mutex // guards pending and writes to stdin
	pending map[int]chan json.RawMessage
	stats   chan json.RawMessage
	exited  chan struct{}
}

// startProc starts a worker process and waits for its ready line. The
// worker inherits hold (the locks of the demo's directories, which it
// never uses: they stay held while it lives), and is killed when the
// demo dies (dieWithParent).
func startProc(exe string, args []string, logs io.Writer, hold []*os.File) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = logs
	cmd.ExtraFiles = hold
	cmd.SysProcAttr = dieWithParent()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, stdin: stdin, pending: map[int]chan json.RawMessage{}, stats: make(chan json.RawMessage, 1), exited: make(chan struct{})}
	ready := make(chan struct{})
	go p.read(stdout, ready)
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("worker %v exited before it was ready", args)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("worker %v not ready in 30s", args)
	}
}

// read hands each answer to its caller until the process's stdout ends:
// the first line says it is ready, lines without an id are its stats.
func (p *proc) read(stdout io.Reader, ready chan struct{}) {
	defer close(p.exited)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	first := true
	for sc.Scan() {
		line := append(json.RawMessage(nil), sc.Bytes()...)
		if first {
			first = false
			close(ready)
			continue
		}
		var head struct {
			ID *int `json:"id"`
		}
		json.Unmarshal(line, &head)
		if head.ID == nil { // stats
			p.stats <- line
			continue
		}
		p.mu.Lock()
		ch := p.pending[*head.ID]
		delete(p.pending, *head.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- line
		}
	}
	p.cmd.Wait()
}

func (p *proc) call(r Request) (Result, error) {
	ch := make(chan json.RawMessage, 1)
	p.mu.Lock()
	p.pending[r.ID] = ch
	line, _ := json.Marshal(r)
	_, err := p.stdin.Write(append(line, '\n'))
	p.mu.Unlock()
	if err != nil {
		return Result{}, err
	}
	select {
	case raw := <-ch:
		var res Result
		if err := json.Unmarshal(raw, &res); err != nil {
			return res, err
		}
		if res.Err != "" {
			return res, errors.New(res.Err)
		}
		return res, nil
	case <-p.exited:
		return Result{}, errors.New("worker exited")
	}
}

func (p *proc) workerStats() (WorkerStats, error) {
	var s WorkerStats
	p.mu.Lock()
	_, err := p.stdin.Write([]byte(`{"id":-1}` + "\n"))
	p.mu.Unlock()
	if err != nil {
		return s, err
	}
	select {
	case raw := <-p.stats:
		return s, json.Unmarshal(raw, &s)
	case <-time.After(30 * time.Second):
		return s, errors.New("worker stats timed out")
	}
}

func (p *proc) stop() {
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}
