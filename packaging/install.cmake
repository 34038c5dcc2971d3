# Runs at install time, from cmake_install.cmake (see the install(CODE) in CMakeLists.txt), so that
# the paths follow the prefix actually in use, including `cmake --install --prefix P`.
#
# Installs:
#   <sysconfdir>/ingressd/ingressd.example.yaml   never ingressd.yaml: a real config stays untouched
#   <sysconfdir>/logrotate.d/ingressd             as is: it names /var/log/ingressd, the unit's
#                                                 LogsDirectory=, whatever the prefix
#   <prefix>/lib/systemd/system/ingressd.service  with ExecStart, --config and Documentation pointing
#                                                 at this install's binary, config and docs
#
# In: INGRESSD_SOURCE_DIR, INGRESSD_BINARY_DIR, and the GNUInstallDirs values as configured
# (INGRESSD_BINDIR, INGRESSD_SYSCONFDIR, INGRESSD_DOCDIR; relative unless given absolute).

string(REGEX REPLACE "(.)/+$" "\\1" _prefix "${CMAKE_INSTALL_PREFIX}")

# GNUInstallDirs' special cases for SYSCONFDIR, applied to the install-time prefix: the GNU coding
# standards put /usr's configuration in /etc, the FHS puts /opt/X's in /etc/opt/X.
function(_ingressd_full_dir out dir kind)
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  elseif(kind STREQUAL "SYSCONFDIR" AND _prefix MATCHES "^/(usr)?$")
    set(full "/${dir}")
  elseif(kind STREQUAL "SYSCONFDIR" AND _prefix MATCHES "^/opt/" AND NOT _prefix MATCHES "^/opt/homebrew/")
    set(full "/${dir}${_prefix}")
  elseif(_prefix STREQUAL "/")
    set(full "/${dir}")
  else()
    set(full "${_prefix}/${dir}")
  endif()
  set(${out} "${full}" PARENT_SCOPE)
endfunction()

_ingressd_full_dir(_bindir "${INGRESSD_BINDIR}" BINDIR)
_ingressd_full_dir(_sysconfdir "${INGRESSD_SYSCONFDIR}" SYSCONFDIR)
_ingressd_full_dir(_docdir "${INGRESSD_DOCDIR}" DOCDIR)
_ingressd_full_dir(_unitdir "lib/systemd/system" LIBDIR)

file(INSTALL DESTINATION "${_sysconfdir}/ingressd" TYPE FILE
     FILES "${INGRESSD_SOURCE_DIR}/config/ingressd.example.yaml")
file(INSTALL DESTINATION "${_sysconfdir}/logrotate.d" TYPE FILE
     FILES "${INGRESSD_SOURCE_DIR}/packaging/logrotate/ingressd")

# The unit in the source tree is the one for prefix /usr (Debian packages, the container image);
# other prefixes get the same unit with their own paths. Placeholders first, so that a prefix which
# happens to contain one of the other paths is not substituted twice.
file(READ "${INGRESSD_SOURCE_DIR}/packaging/systemd/ingressd.service" _unit)
foreach(_pair "/usr/bin/ingressd|@BIN@" "/usr/share/doc/ingressd|@DOC@" "/etc/ingressd|@ETC@")
  string(REPLACE "|" ";" _pair "${_pair}")
  list(GET _pair 0 _from)
  list(GET _pair 1 _to)
  string(REPLACE "${_from}" "${_to}" _unit "${_unit}")
endforeach()
string(REPLACE "@BIN@" "${_bindir}/ingressd" _unit "${_unit}")
string(REPLACE "@DOC@" "${_docdir}" _unit "${_unit}")
string(REPLACE "@ETC@" "${_sysconfdir}/ingressd" _unit "${_unit}")
# One staging file per destination, so installs of one build into different roots cannot collide.
string(MD5 _key "$ENV{DESTDIR}${_unitdir}")
set(_staged "${INGRESSD_BINARY_DIR}/packaging/ingressd.service.${_key}")
file(WRITE "${_staged}" "${_unit}")
file(INSTALL DESTINATION "${_unitdir}" TYPE FILE RENAME ingressd.service FILES "${_staged}")
file(REMOVE "${_staged}")
