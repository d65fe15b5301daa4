'use strict';
// smtp-server-peer: nodemailer's smtp-server (npm package smtp-server, the version pinned in
// package.json beside this file, installed by tests/deps.sh with npm ci) storing every message it
// accepts, envelope and content exactly as smtp-server hands them over, for the interop tests of
// smtpe's client (tests/integration/peers.py starts it with node).
//
// smtp-server as shipped: PIPELINING, 8BITMIME, SMTPUTF8, ENHANCEDSTATUSCODES, DSN, SIZE,
// STARTTLS (--cert/--key), AUTH PLAIN and LOGIN (--auth; optional, also offered without TLS);
// no CHUNKING. Its content stream is dot-unstuffed and otherwise untouched.
//
// Listeners, each printed once bound as "listening NAME ADDRESS" on stderr, then one "ready":
//   --listen NAME=HOST:PORT | NAME=unix:PATH        SMTP (STARTTLS offered with --cert)
//   --tls-listen NAME=HOST:PORT                      SMTP over implicit TLS (RFC 8314)
//   --lmtp-listen NAME=HOST:PORT | NAME=unix:PATH   LMTP (smtp-server's lmtp mode)
// Port 0 picks a free port; the printed address has the real one.
//
// Store (--store DIR): for each accepted message N (1, 2, ...) DIR/N.msg, then DIR/N.json
// renamed into place: {"mail_from", "rcpt_tos" (those it was stored for), "mail_args" and
// "rcpt_args" (smtp-server's parsed parameters: {KEYWORD: value or true}), "helo", "protocol"
// ("smtp" or "lmtp"), "listener", "tls", "auth", "smtputf8"}.
//
// Recipients by local part, as in the other envelope-storing peers: reject* 550 and defer* 450
// at RCPT; datafail* 554 and datadefer* 451 after the content (in LMTP for that recipient only,
// the message stored for the others; in SMTP for the whole message, nothing stored).
// smtp-server adds the enhanced status codes itself. Exits 0 on SIGTERM or SIGINT.
const fs = require('fs');
const path = require('path');
const { SMTPServer } = require('smtp-server');

function usage(msg) {
    process.stderr.write('smtp-server-peer: ' + msg + '\n');
    process.exit(2);
}

function parseArgv(argv) {
    const a = { listen: [], tlsListen: [], lmtpListen: [] };
    a.store = a.cert = a.key = a.auth = null;
    const names = {
        '--listen': 'listen',
        '--tls-listen': 'tlsListen',
        '--lmtp-listen': 'lmtpListen'
    };
    for (let i = 0; i < argv.length; i++) {
        const opt = argv[i];
        const val = argv[i + 1];
        if (val === undefined) usage('missing value after ' + opt);
        i++;
        if (names[opt]) a[names[opt]].push(val);
        else if (opt === '--store') a.store = val;
        else if (opt === '--cert') a.cert = val;
        else if (opt === '--key') a.key = val;
        else if (opt === '--auth') a.auth = val;
        else usage('unknown option ' + opt);
    }
    if (!a.store) usage('need --store');
    if (a.listen.length + a.tlsListen.length + a.lmtpListen.length === 0) usage('no listener');
    if (a.tlsListen.length && !a.cert) usage('--tls-listen needs --cert and --key');
    return a;
}

const args = parseArgv(process.argv.slice(2));
const tls = args.cert ? { cert: fs.readFileSync(args.cert), key: fs.readFileSync(args.key) } : null;
let authUser = null;
let authPassword = null;
if (args.auth) {
    const i = args.auth.indexOf(':');
    authUser = args.auth.slice(0, i);
    authPassword = args.auth.slice(i + 1);
}
let stored = 0;

function store(content, meta) {
    stored++;
    const base = path.join(args.store, String(stored));
    fs.writeFileSync(base + '.msg', content);
    fs.writeFileSync(base + '.json.tmp', JSON.stringify(meta));
    fs.renameSync(base + '.json.tmp', base + '.json');
    return stored;
}

function localPart(address) {
    const i = address.lastIndexOf('@');
    return i >= 0 ? address.slice(0, i) : address;
}

function smtpError(code, text) {
    const err = new Error(text);
    err.responseCode = code;
    return err;
}

// The error a recipient gets after the content, or null.
function verdict(address) {
    const lp = localPart(address);
    if (lp.startsWith('datafail')) return smtpError(554, 'content refused (datafail recipient)');
    if (lp.startsWith('datadefer')) return smtpError(451, 'content deferred (datadefer recipient)');
    return null;
}

function meta(session, protocol, listener, rcpts) {
    const env = session.envelope;
    const from = env.mailFrom || { address: '', args: false };
    return {
        mail_from: from.address || '',
        rcpt_tos: rcpts.map(r => r.address),
        mail_args: from.args || {},
        rcpt_args: rcpts.map(r => r.args || {}),
        helo: session.hostNameAppearsAs || '',
        protocol,
        listener,
        tls: Boolean(session.secure),
        auth: session.user ? session.user.username || String(session.user) : null,
        smtputf8: Boolean(from.args && from.args.SMTPUTF8)
    };
}

function makeServer(listener, protocol, implicit) {
    const disabled = [];
    if (!tls) disabled.push('STARTTLS');
    if (!authUser) disabled.push('AUTH');
    const options = {
        name: 'node.peer.test',
        lmtp: protocol === 'lmtp',
        secure: implicit,
        size: 32 * 1024 * 1024,
        logger: false,
        disableReverseLookup: true, // no DNS query for the client's address
        hideDSN: false,
        hideENHANCEDSTATUSCODES: false,
        disabledCommands: disabled,
        authOptional: true,
        allowInsecureAuth: true,
        authMethods: ['PLAIN', 'LOGIN'],
        onAuth(auth, session, callback) {
            if (auth.username === authUser && auth.password === authPassword) {
                return callback(null, { user: { username: auth.username } });
            }
            return callback(smtpError(535, 'Authentication credentials invalid'));
        },
        onRcptTo(address, session, callback) {
            const lp = localPart(address.address);
            const shown = '<' + address.address + '>';
            if (lp.startsWith('reject')) {
                return callback(smtpError(550, shown + ': no such user here'));
            }
            if (lp.startsWith('defer')) {
                return callback(smtpError(450, shown + ': try again later'));
            }
            return callback();
        },
        onData(stream, session, callback) {
            const chunks = [];
            stream.on('data', chunk => chunks.push(chunk));
            stream.on('end', () => {
                if (stream.sizeExceeded) {
                    return callback(smtpError(552, 'message exceeds the size limit'));
                }
                const content = Buffer.concat(chunks);
                const rcpts = session.envelope.rcptTo;
                if (protocol === 'lmtp') {
                    const ok = rcpts.filter(r => !verdict(r.address));
                    let n = 0;
                    if (ok.length) n = store(content, meta(session, protocol, listener, ok));
                    const replies = rcpts.map(r => verdict(r.address) || 'OK: stored as ' + n);
                    return callback(null, replies);
                }
                for (const r of rcpts) {
                    const err = verdict(r.address);
                    if (err) return callback(err);
                }
                const n = store(content, meta(session, protocol, listener, rcpts));
                return callback(null, 'Ok: stored as ' + n);
            });
        }
    };
    if (tls) Object.assign(options, tls);
    return new SMTPServer(options);
}

function listen(spec, protocol, implicit) {
    const eq = spec.indexOf('=');
    if (eq <= 0) usage('listener must be NAME=ADDRESS, not ' + spec);
    const name = spec.slice(0, eq);
    const addr = spec.slice(eq + 1);
    const server = makeServer(name, protocol, implicit);
    server.on('error', err => {
        process.stderr.write('smtp-server-peer: ' + name + ': ' + err.message + '\n');
    });
    return new Promise((resolve, reject) => {
        const done = () => {
            const bound = server.server.address();
            const shown = typeof bound === 'string' ? 'unix:' + bound
                : bound.address + ':' + bound.port;
            process.stderr.write('listening ' + name + ' ' + shown + '\n');
            resolve(server);
        };
        server.server.once('error', reject);
        if (addr.startsWith('unix:')) {
            server.listen(addr.slice(5), done);
        } else {
            const colon = addr.lastIndexOf(':');
            const host = addr.slice(0, colon).replace(/^\[|\]$/g, '');
            server.listen(Number(addr.slice(colon + 1)), host, done);
        }
    });
}

async function main() {
    for (const s of args.listen) await listen(s, 'smtp', false);
    for (const s of args.tlsListen) await listen(s, 'smtp', true);
    for (const s of args.lmtpListen) await listen(s, 'lmtp', false);
    process.stderr.write('ready\n');
}

for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
main().catch(err => {
    process.stderr.write('smtp-server-peer: ' + err.message + '\n');
    process.exit(1);
});
