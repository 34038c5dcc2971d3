#!/usr/bin/env bash
# Prints, sorted, every file `cmake --install` puts in place, relative to the install root: the
# one statement of the install layout, used by install_layout.sh (ctest) and by
# packaging/container/check.sh (the container's staged tree).
#
#   expected_layout.sh SOURCE_DIR PREFIX SYSCONFDIR     e.g. . usr etc
set -euo pipefail
source_dir=$1 prefix=${2#/} sysconfdir=${3#/}
prefix=${prefix:+$prefix/}
{
  echo "${prefix}bin/ingressd"
  echo "$sysconfdir/ingressd/ingressd.example.yaml"
  echo "${prefix}lib/systemd/system/ingressd.service"
  echo "${prefix}lib/sysusers.d/ingressd.conf"
  echo "$sysconfdir/logrotate.d/ingressd"
  echo "${prefix}share/man/man8/ingressd.8"
  echo "${prefix}share/ingressd/grafana/ingressd.json"
  echo "${prefix}share/ingressd/prometheus/ingressd.rules.yml"
  echo "${prefix}share/doc/ingressd/README.md"
  echo "${prefix}share/doc/ingressd/LICENSE"
  for doc in "$source_dir"/docs/*.md; do echo "${prefix}share/doc/ingressd/docs/$(basename "$doc")"; done
} | LC_ALL=C sort
