#!/usr/bin/env bash
# Rewrites the old protocol citations in Go comments to the repository's
# own docs/protocol.md (same section numbers), in place:
#   PROTOCOL.md §N, PROTOCOL §N  ->  protocol §N
#   PROTOCOL.md (no section)     ->  docs/protocol.md
#   ../shared/vectors, shared/vectors -> testdata/vectors
# Only the comment part of a line (from its first //) is touched. Safe to
# re-run (a second run changes nothing); after merging a branch, run it and
# then `go test ./internal/doccheck/`, which reports what is left to fix by
# hand (issue numbers, sections that do not exist).
set -euo pipefail
cd "$(dirname "$0")/.."
# internal/doccheck is skipped: its tests hold the old forms on purpose.
find . -mindepth 1 \( -name '.*' -o -name bin -o -name testdata -o -path ./internal/doccheck \) -prune -o -name '*.go' -print0 |
	xargs -0 -r perl -CSD -i -ne '
		chomp(my $l = $_);
		if ($l =~ m{^(.*?)(//.*)$}) {
			my ($code, $c) = ($1, $2);
			$c =~ s/PROTOCOL(?:\.md)? \x{a7}/protocol \x{a7}/g;
			$c =~ s/PROTOCOL\.md/docs\/protocol.md/g;
			$c =~ s{(?:\.\./)*shared/vectors}{testdata/vectors}g;
			$l = $code . $c;
		}
		print $l, "\n";
	'
