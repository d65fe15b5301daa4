/*
 * cli.h - the command line of smtpe-server. Its switches are a contract other tools (tests,
 * benchmarks, the load generator's scripts) depend on: add switches, never change one.
 */
#ifndef SMTPE_HOST_CLI_H
#define SMTPE_HOST_CLI_H

#include <stdio.h>

#include "host.h"

#define CLI_RUN 0   /* options parsed: run */
#define CLI_HELP 1  /* --help printed: exit 0 */
#define CLI_USAGE 2 /* usage error printed on stderr: exit 2 */

/* Parses argv into *o, starting from the defaults. Returns CLI_RUN, CLI_HELP or CLI_USAGE.
 * o keeps pointers into argv. The model name is not checked here (main.c knows the models). */
int cli_parse(int argc, char **argv, struct host_options *o);

/* Prints the help text (every switch and its default) to f. */
void cli_usage(FILE *f);

#endif
