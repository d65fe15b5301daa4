# frozen_string_literal: true

module Smtpe
  # The gem's version (the engine's is Smtpe.engine_version).
  VERSION = "0.4.0"
end
