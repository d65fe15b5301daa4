// go-smtp-sink: a peer of the smtpe benchmark (tests/bench/run.sh), a go-smtp
// (github.com/emersion/go-smtp) server that accepts every MAIL and RCPT, reads each message to
// its end and discards it. go-smtp advertises PIPELINING itself. Built offline from Debian's
// golang-github-emersion-go-smtp-dev by tests/bench/peers/start.sh (GO111MODULE=off,
// GOPATH=/usr/share/gocode). Prints "listening on 127.0.0.1:PORT" on stderr once bound; exits 0
// on SIGTERM or SIGINT.
//
//	go-smtp-sink -listen 127.0.0.1:2525
package main

import (
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/emersion/go-smtp"
)

type backend struct{}

func (backend) Login(*smtp.ConnectionState, string, string) (smtp.Session, error) {
	return nil, smtp.ErrAuthUnsupported
}

func (backend) AnonymousLogin(*smtp.ConnectionState) (smtp.Session, error) {
	return session{}, nil
}

type session struct{}

func (session) Reset()                              {}
func (session) Logout() error                       { return nil }
func (session) Mail(string, smtp.MailOptions) error { return nil }
func (session) Rcpt(string) error                   { return nil }

func (session) Data(r io.Reader) error {
	_, err := io.Copy(ioutil.Discard, r)
	return err
}

func main() {
	addr := flag.String("listen", "127.0.0.1:2525", "address:port to listen on")
	flag.Parse()

	var rl syscall.Rlimit // Go 1.19 raises it too, but say so
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}

	s := smtp.NewServer(backend{})
	s.Domain = "gosink"
	s.MaxRecipients = 100000
	s.AuthDisabled = true
	s.ErrorLog = log.New(os.Stderr, "go-smtp-sink: ", 0)

	// The listen backlog is net.core.somaxconn, which Go reads itself.
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-smtp-sink:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "listening on", l.Addr().String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		os.Exit(0)
	}()
	if err := s.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "go-smtp-sink:", err)
		os.Exit(1)
	}
}
