// go-smtp-peer: a go-smtp (github.com/emersion/go-smtp, Debian's
// golang-github-emersion-go-smtp-dev 0.12) server that stores every message it accepts, envelope
// and content as go-smtp hands them over, for the interop tests of smtpe's client
// (tests/integration/peers.py builds it offline with GO111MODULE=off, GOPATH=/usr/share/gocode,
// and starts it).
//
// go-smtp 0.12 as shipped: PIPELINING, 8BITMIME, ENHANCEDSTATUSCODES, SMTPUTF8 (-smtputf8),
// STARTTLS (-cert/-key), AUTH PLAIN (-auth), SIZE (-size); no CHUNKING, no DSN (it does not parse
// RCPT parameters). Lines (commands and content) longer than go-smtp's MaxLineLength, 2000
// octets, end the session. Its content reader is net/textproto's DotReader, which
// dot-unstuffs and turns each CRLF into LF: N.msg holds LF line ends (a CR not followed by LF
// stays as it is).
//
// Listeners, each printed once bound as "listening NAME ADDRESS" on stderr, then one "ready":
//
//	-listen NAME=HOST:PORT|NAME=unix:PATH       SMTP (STARTTLS offered with -cert)
//	-tls-listen NAME=HOST:PORT                  SMTP over implicit TLS (RFC 8314)
//	-lmtp-listen NAME=HOST:PORT|NAME=unix:PATH  LMTP (go-smtp's LMTP mode; per-recipient
//	                                            replies through its LMTPData)
//
// Port 0 picks a free port; the printed address has the real one.
//
// Store (-store DIR): for each accepted message N (1, 2, ...) DIR/N.msg, then DIR/N.json renamed
// into place: {"mail_from", "rcpt_tos" (the recipients it was stored for), "mail_args"
// ({"SIZE": "n", "SMTPUTF8": true, "REQUIRETLS": true}, those go-smtp reports), "rcpt_args"
// (empty objects), "helo", "protocol" ("smtp" or "lmtp"), "listener", "tls", "auth",
// "smtputf8", "line_ending": "lf"}.
//
// Recipients by local part, as in the other envelope-storing peers: reject* 550 5.1.1 and
// defer* 450 4.2.1 at RCPT; datafail* 554 5.6.0 and datadefer* 451 4.3.0 after the content (in
// LMTP for that recipient only, the others get 250 and the message is stored for them; in SMTP
// for the whole message, nothing stored). Exits 0 on SIGTERM or SIGINT.
//
//	go-smtp-peer -store DIR -listen smtp=127.0.0.1:0 -lmtp-listen lmtp=unix:/tmp/x/lmtp
package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/emersion/go-smtp"
)

// store: the directory and the number of the last message written (under mu).
type store struct {
	dir string
	mu  sync.Mutex
	n   int
}

func (s *store) put(content []byte, meta map[string]interface{}) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	base := filepath.Join(s.dir, strconv.Itoa(s.n))
	if err := ioutil.WriteFile(base+".msg", content, 0644); err != nil {
		return err
	}
	js, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	if err := ioutil.WriteFile(base+".json.tmp", js, 0644); err != nil {
		return err
	}
	return os.Rename(base+".json.tmp", base+".json")
}

type backend struct {
	st       *store
	listener string
	protocol string
	user     string
	password string
}

func (b *backend) newSession(state *smtp.ConnectionState, auth interface{}) *session {
	return &session{b: b, helo: state.Hostname, tls: state.TLS.HandshakeComplete, auth: auth}
}

func (b *backend) Login(state *smtp.ConnectionState, user, password string) (smtp.Session, error) {
	if b.user == "" {
		return nil, smtp.ErrAuthUnsupported
	}
	if user != b.user || password != b.password {
		return nil, &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8},
			Message: "Authentication credentials invalid"}
	}
	return b.newSession(state, user), nil
}

func (b *backend) AnonymousLogin(state *smtp.ConnectionState) (smtp.Session, error) {
	return b.newSession(state, nil), nil
}

// session: one connection's state; from, opts and rcpts are those of the current transaction.
type session struct {
	b     *backend
	helo  string
	tls   bool
	auth  interface{} // the AUTH user (string) or nil
	from  string
	opts  smtp.MailOptions
	rcpts []string
}

func localPart(addr string) string {
	if i := strings.LastIndexByte(addr, '@'); i >= 0 {
		return addr[:i]
	}
	return addr
}

func (s *session) Reset() {
	s.from, s.opts, s.rcpts = "", smtp.MailOptions{}, nil
}

func (s *session) Logout() error { return nil }

func (s *session) Mail(from string, opts smtp.MailOptions) error {
	s.from, s.opts, s.rcpts = from, opts, nil
	return nil
}

func (s *session) Rcpt(to string) error {
	lp := localPart(to)
	switch {
	case strings.HasPrefix(lp, "reject"):
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1},
			Message: "<" + to + ">: no such user here"}
	case strings.HasPrefix(lp, "defer"):
		return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 2, 1},
			Message: "<" + to + ">: try again later"}
	}
	s.rcpts = append(s.rcpts, to)
	return nil
}

var (
	errDataFail = &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0},
		Message: "content refused (datafail recipient)"}
	errDataDefer = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0},
		Message: "content deferred (datadefer recipient)"}
)

// verdict: the error a recipient gets after the content (nil: delivered).
func verdict(rcpt string) error {
	lp := localPart(rcpt)
	switch {
	case strings.HasPrefix(lp, "datafail"):
		return errDataFail
	case strings.HasPrefix(lp, "datadefer"):
		return errDataDefer
	}
	return nil
}

func (s *session) save(content []byte, rcpts []string) error {
	mailArgs := map[string]interface{}{}
	if s.opts.Size != 0 {
		mailArgs["SIZE"] = strconv.Itoa(s.opts.Size)
	}
	if s.opts.UTF8 {
		mailArgs["SMTPUTF8"] = true
	}
	if s.opts.RequireTLS {
		mailArgs["REQUIRETLS"] = true
	}
	rcptArgs := make([]map[string]interface{}, len(rcpts))
	for i := range rcptArgs {
		rcptArgs[i] = map[string]interface{}{}
	}
	meta := map[string]interface{}{
		"mail_from": s.from, "rcpt_tos": rcpts, "mail_args": mailArgs, "rcpt_args": rcptArgs,
		"helo": s.helo, "protocol": s.b.protocol, "listener": s.b.listener, "tls": s.tls,
		"auth": s.auth, "smtputf8": s.opts.UTF8, "line_ending": "lf",
	}
	if err := s.b.st.put(content, meta); err != nil {
		log.Printf("store: %v", err)
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0},
			Message: "cannot store"}
	}
	return nil
}

// Data: SMTP's one reply for the whole message.
func (s *session) Data(r io.Reader) error {
	content, err := ioutil.ReadAll(r)
	if err != nil {
		return err
	}
	for _, rc := range s.rcpts {
		if e := verdict(rc); e != nil {
			return e
		}
	}
	return s.save(content, s.rcpts)
}

// LMTPData: one status per recipient (RFC 2033 section 4.2), in RCPT order.
func (s *session) LMTPData(r io.Reader, status smtp.StatusCollector) error {
	content, err := ioutil.ReadAll(r)
	if err != nil {
		return err
	}
	var ok []string
	for _, rc := range s.rcpts {
		if verdict(rc) == nil {
			ok = append(ok, rc)
		}
	}
	var saveErr error
	if len(ok) > 0 {
		saveErr = s.save(content, ok)
	}
	for _, rc := range s.rcpts {
		if e := verdict(rc); e != nil {
			status.SetStatus(rc, e)
		} else {
			status.SetStatus(rc, saveErr)
		}
	}
	return nil
}

type listenFlag []string

func (l *listenFlag) String() string     { return strings.Join(*l, ",") }
func (l *listenFlag) Set(v string) error { *l = append(*l, v); return nil }

func listen(spec string, tlsConfig *tls.Config) (name string, l net.Listener, err error) {
	name, addr, found := strings.Cut(spec, "=")
	if !found || name == "" {
		return "", nil, errors.New("listener must be NAME=ADDRESS, not " + spec)
	}
	network := "tcp"
	if strings.HasPrefix(addr, "unix:") {
		network, addr = "unix", addr[5:]
	}
	if tlsConfig != nil {
		l, err = tls.Listen(network, addr, tlsConfig)
	} else {
		l, err = net.Listen(network, addr)
	}
	return name, l, err
}

func main() {
	var plain, implicit, lmtp listenFlag
	flag.Var(&plain, "listen", "NAME=HOST:PORT or NAME=unix:PATH: SMTP (repeatable)")
	flag.Var(&implicit, "tls-listen", "NAME=HOST:PORT: SMTP over implicit TLS (repeatable)")
	flag.Var(&lmtp, "lmtp-listen", "NAME=HOST:PORT or NAME=unix:PATH: LMTP (repeatable)")
	dir := flag.String("store", "", "directory the messages go to")
	cert := flag.String("cert", "", "PEM certificate: STARTTLS offered, -tls-listen possible")
	key := flag.String("key", "", "PEM private key of -cert")
	auth := flag.String("auth", "", "USER:PASSWORD: offer AUTH PLAIN (also without TLS)")
	utf8 := flag.Bool("smtputf8", false, "offer SMTPUTF8")
	size := flag.Int("size", 32<<20, "maximum message size in octets (SIZE)")
	domain := flag.String("domain", "gosmtp.peer.test", "the name in the greeting")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("go-smtp-peer: ")
	if *dir == "" || len(plain)+len(implicit)+len(lmtp) == 0 {
		log.Fatal("need -store and at least one listener")
	}

	var tlsConfig *tls.Config
	if *cert != "" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			log.Fatal(err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{pair}}
	}
	if len(implicit) > 0 && tlsConfig == nil {
		log.Fatal("-tls-listen needs -cert and -key")
	}
	user, password, _ := strings.Cut(*auth, ":")
	st := &store{dir: *dir}

	newServer := func(name, protocol string) *smtp.Server {
		s := smtp.NewServer(&backend{st: st, listener: name, protocol: protocol,
			user: user, password: password})
		s.Domain = *domain
		s.TLSConfig = tlsConfig
		s.LMTP = protocol == "lmtp"
		s.MaxMessageBytes = *size
		s.EnableSMTPUTF8 = *utf8
		s.AllowInsecureAuth = true
		s.AuthDisabled = user == ""
		s.ErrorLog = log.New(os.Stderr, "go-smtp-peer: "+name+": ", 0)
		return s
	}

	// before "ready": a stop may follow at once
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var servers []*smtp.Server
	start := func(specs listenFlag, protocol string, tlsWrap *tls.Config) {
		for _, spec := range specs {
			name, l, err := listen(spec, tlsWrap)
			if err != nil {
				log.Fatal(err)
			}
			s := newServer(name, protocol)
			servers = append(servers, s)
			shown := l.Addr().String()
			if l.Addr().Network() == "unix" {
				shown = "unix:" + shown
			}
			fmt.Fprintf(os.Stderr, "listening %s %s\n", name, shown)
			go func() {
				if err := s.Serve(l); err != nil {
					log.Printf("%s: %v", name, err)
				}
			}()
		}
	}
	start(plain, "smtp", nil)
	start(implicit, "smtp", tlsConfig)
	start(lmtp, "lmtp", nil)
	fmt.Fprintln(os.Stderr, "ready")
	<-sig
	for _, s := range servers {
		s.Close()
	}
	os.Exit(0)
}
