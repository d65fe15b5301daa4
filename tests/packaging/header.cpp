// header.cpp - smtpe.h compiles as C++ without a warning (tests/packaging/run.sh runs
// g++ and clang++ -std=c++11/17/20 -Wall -Wextra -pedantic -Werror -fsyntax-only on it).
// It uses the header's types, enums, flag macros and function declarations the way C++ host
// code would; it is never linked.
#include "smtpe.h"

#include <cstddef>
#include <cstdint>

namespace {

std::size_t domain_length(const smtpe_event &ev)
{
    switch (ev.type) {
    case SMTPE_EV_HELO:
        return ev.helo.domain.len;
    case SMTPE_EV_MAIL:
        return ev.mail.reverse_path.domain.len;
    case SMTPE_EV_RCPT:
        return (ev.rcpt.forward_path.flags & SMTPE_PATH_POSTMASTER) ? 0
                                                                   : ev.rcpt.forward_path.domain.len;
    default:
        return 0;
    }
}

int serve_one(const std::uint8_t *in, std::size_t len)
{
    smtpe_server_config cfg;
    smtpe_server_config_init(&cfg);
    cfg.hostname = "mx.example";
    cfg.extensions |= SMTPE_EXT_CHUNKING | SMTPE_EXT_DSN;
    cfg.line_ending = SMTPE_LINE_ENDING_NORMALISE;

    smtpe_server *s = nullptr;
    int rc = smtpe_server_new(&s, &cfg, nullptr, 0);
    if (rc != 0)
        return rc <= SMTPE_ERR_FATAL ? -1 : rc;
    if (smtpe_server_recv(s, in, len, 0) < 0) {
        smtpe_server_free(s);
        return -1;
    }
    smtpe_event ev = {};
    std::size_t total = 0;
    while (smtpe_server_next_event(s, &ev) == 1) {
        total += domain_length(ev);
        if (smtpe_event_needs_reply(&ev))
            rc = ev.type == SMTPE_EV_RCPT ? smtpe_server_reply(s, 550, "5.7.1", "Relaying denied")
                                          : smtpe_server_accept(s);
    }
    std::size_t out_len = 0;
    const std::uint8_t *out = smtpe_server_send_buf(s, &out_len);
    if (out != nullptr && out_len > 0)
        smtpe_server_send_ack(s, out_len);
    unsigned want = smtpe_server_want(s);
    smtpe_server_stats st;
    smtpe_server_get_stats(s, &st);
    smtpe_server_free(s);
    return (want & SMTPE_WANT_CLOSE) != 0 && st.commands > 0 ? static_cast<int>(total) : rc;
}

} // namespace

int main()
{
    static const std::uint8_t in[] = "EHLO x\r\n";
    return serve_one(in, sizeof in - 1);
}
