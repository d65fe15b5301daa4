# frozen_string_literal: true

# smtpe for Ruby: the smtpe SMTP/LMTP engine (C, sans-I/O) as a native extension, with a Ruby
# host layer on top.
#
# Engine level (no I/O; you read and write):: Smtpe::ServerConfig, Smtpe::ServerSession,
#   Smtpe::ClientConfig, Smtpe::ClientSession, the frozen events of Smtpe::Event and
#   Smtpe::ClientEvent, errors under Smtpe::Error.
# Host level:: Smtpe::Handler (your verdicts), Smtpe::ServerDriver (a session over a handler),
#   Smtpe::Connection (a driver over an IO, STARTTLS by openssl), Smtpe::Server (the threads,
#   fibers, prefork and ractors models), Smtpe::Maildir (durable delivery), Smtpe::SMTP (a client
#   in the spirit of Net::SMTP with per-recipient outcomes).
require_relative "smtpe/version"
require_relative "smtpe/events"
require_relative "smtpe/handler"
require "smtpe/smtpe"
require_relative "smtpe/server_driver"
require_relative "smtpe/connection"
require_relative "smtpe/server"
require_relative "smtpe/maildir"
require_relative "smtpe/smtp"
