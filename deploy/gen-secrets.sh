#!/bin/sh
# Makes the secrets a sparseps cluster runs with (docs/security.md), in DIR:
#   token                  the shared token every gRPC call and every metrics scrape carries (64 hex digits)
#   ca.pem                 a private CA's certificate: clients verify the servers with it
#   server.pem server.key  the servers' certificate, naming every NAME given, localhost and 127.0.0.1 (a NAME
#                          that is an IPv4 or IPv6 address as an address: TLS clients match an address
#                          against the certificate's IP names only)
#   client.pem client.key  a client certificate, for servers started with --tls-ca ca.pem (mutual TLS)
# The CA's key is not kept: no other certificate can be issued under this CA. Secrets already in DIR are kept
# (a restart keeps them), unless a certificate there has expired or client.pem or client.key is missing (exit 1,
# naming it: no certificate can be made for the kept CA, whose key is gone); to add a server name, or to
# renew, remove DIR and run this again, then restart every pod. A NAME that is neither a host name nor an IPv4 or
# IPv6 address (300.1.1.1, ps-0:50051, -ps, a..b) fails, naming it, before anything is written; the files are made
# in a scratch folder and moved into DIR once all are made, so a failing openssl (its words shown) leaves no part of
# a set.
#   deploy/gen-secrets.sh DIR NAME...                                      needs the openssl command
#   deploy/gen-secrets.sh /secrets ps-0 ps-1                               (docker-compose.yml's secrets job)
#   deploy/gen-secrets.sh ./secrets sparseps-0.sparseps sparseps-1.sparseps \
#     sparseps-0.sparseps.NAMESPACE.svc sparseps-1.sparseps.NAMESPACE.svc \
#     && kubectl create secret generic sparseps-secrets --from-file=./secrets   (deploy/k8s)
set -eu
# The subjectAltName entry of a NAME: IP:ADDRESS for an IPv4 address (only digits and dots: a dotted quad of
# 0-255, no leading zeros) or an IPv6 address (a colon, which no host name holds), else DNS:NAME for a host name
# (is_host_name). A NAME that is none of these (300.1.1.1, ps-0:50051, a,b, -ps, a..b) fails, naming it, returning 1.
san_of() {
    case $1 in
        *:*) is_ipv6 "$1" && echo "IP:$1" && return ;;
        *[!0-9.]*) is_host_name "$1" && echo "DNS:$1" && return ;;
        *) is_ipv4 "$1" && echo "IP:$1" && return ;;
    esac
    echo "error: NAME '$1' is neither a host name (labels of 1-63 letters, digits, '-' or '_' joined by single" \
         "dots, none starting or ending with '-'; '*.' before them for a wildcard) nor an IPv4 address (four" \
         "numbers 0-255) nor an IPv6 address (RFC 4291 text form); nothing was written" >&2
    return 1
}
# Whether $1 is a host name of RFC 1123 labels joined by single dots, 253 characters at most: each label 1-63
# letters, digits and '-', neither first nor last a '-'; also '_' (not RFC 1123's, but Docker Compose's service
# names, which its network resolves, may hold it), and a first label '*' (a wildcard) with at least one after it.
is_host_name() (
    case $1 in "" | *[!A-Za-z0-9._*-]* | .* | *. | *..*) return 1 ;; esac
    [ ${#1} -le 253 ] || return 1
    case $1 in \*.*) rest=${1#\*.} ;; *) rest=$1 ;; esac
    set -f
    IFS=.
    # shellcheck disable=SC2086  # split on the dots
    set -- $rest
    for label; do
        case $label in "" | -* | *- | *\**) return 1 ;; esac
        [ ${#label} -le 63 ] || return 1
    done
)
# Whether $1 is four dot-separated numbers 0-255 without leading zeros (1.2.3.4, not 01.2.3.4 nor 1.2.3).
is_ipv4() (
    case $1 in *[!0-9.]* | *..* | .* | *. | "") return 1 ;; esac
    set -f
    IFS=.
    # shellcheck disable=SC2086  # split on the dots
    set -- $1
    [ $# -eq 4 ] || return 1
    for octet; do
        case $octet in ????* | 0?*) return 1 ;; esac
        [ "$octet" -le 255 ] || return 1
    done
)
# Whether $1 is an IPv6 address in RFC 4291 text form: eight groups of 1-4 hex digits, or fewer with one "::"
# standing for the rest, the last two optionally an IPv4 address (::ffff:10.1.2.3). No zone (%eth0).
is_ipv6() (
    a=$1
    case $a in *[!0-9A-Fa-f:.]* | *::*::* | *:::*) return 1 ;; esac
    case $a in *.*) v4=${a##*:}; is_ipv4 "$v4" || return 1; a="${a%"$v4"}0:0" ;; esac
    case $a in
        *::*) left=$(hex_groups "${a%%::*}") && right=$(hex_groups "${a#*::}") && [ $((left + right)) -le 7 ] ;;
        *) [ "$(hex_groups "$a")" = 8 ] ;;
    esac
)
# The number of colon-separated groups of 1-4 hex digits in $1 (0 for ""); returns 1 on anything else.
hex_groups() (
    case $1 in "") echo 0; return ;; :* | *: | *::*) return 1 ;; esac
    set -f
    IFS=:
    # shellcheck disable=SC2086  # split on the colons
    set -- $1
    for group; do case $group in "" | ?????* | *[!0-9A-Fa-f]*) return 1 ;; esac; done
    echo $#
)
# Runs openssl with the arguments given; on failure shows what openssl said and exits 1 (the secrets are made in
# a scratch folder and moved into DIR only once all are made, so DIR is left as it was).
run_openssl() {
    openssl "$@" 2>"$work/openssl.err" || {
        echo "error: openssl $1 failed; no secrets were written to $dir; openssl said:" >&2
        cat "$work/openssl.err" >&2
        exit 1
    }
}
[ $# -ge 1 ] || { echo "usage: $0 DIR [SERVER-NAME...]" >&2; exit 2; }
dir=$1
shift
san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    entry=$(san_of "$name") || exit 1
    case ",$san," in *",$entry,"*) ;; *) san="$san,$entry" ;; esac  # each name once
done
umask 077
mkdir -p "$dir"
cd "$dir"
if [ -s token ] && [ -s server.pem ] && [ -s server.key ] && [ -s ca.pem ]; then
    for f in client.pem client.key; do  # the CA's key is not kept: a missing one cannot be made again
        if [ ! -s "$f" ]; then
            echo "error: $dir holds the servers' secrets (token, ca.pem, server.pem, server.key) but no $f: no" \
                 "client certificate can be made for the kept CA (its key is not kept), and servers under mutual" \
                 "TLS (--tls-ca) refuse clients without one; nothing was changed; to make a new set, remove $dir," \
                 "run this again and restart every server and worker" >&2
            exit 1
        fi
    done
    expired=""  # a kept certificate past its end: servers, workers and probes refuse it at start
    for f in ca.pem server.pem client.pem; do
        end=$(openssl x509 -in "$f" -noout -enddate 2>/dev/null | sed 's/^notAfter=//' || true)
        if [ -n "$end" ] && ! openssl x509 -in "$f" -noout -checkend 0 >/dev/null 2>&1; then
            echo "error: $dir/$f expired ($end): servers and workers refuse it; nothing was changed; to make" \
                 "new secrets, remove $dir, run this again and restart every server and worker" >&2
            expired=1
        fi
    done
    [ -z "$expired" ] || exit 1
    echo "sparseps secrets in $dir exist already; kept"
    for name in "$@"; do
        check=$(case $(san_of "$name") in IP:*) echo -checkip ;; *) echo -checkhost ;; esac)
        case $(openssl x509 -in server.pem -noout "$check" "$name" 2>/dev/null) in
            *" does match certificate"*) ;;
            *) echo "warning: the kept server certificate does not name $name: to add it, remove $dir, run this" \
                   "again and restart every server and worker" >&2 ;;
        esac
    done
    exit 0
fi
for f in token server.pem server.key ca.pem client.pem client.key; do
    if [ -e "$f" ]; then
        echo "error: $dir holds part of a set of secrets ($f, but not all of token, ca.pem, server.pem and" \
             "server.key): making a new set would lock out the servers and workers that use the old one; remove" \
             "$dir to make a new set, then restart every server and worker" >&2
        exit 1
    fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# shellcheck disable=SC2086  # $ec is several arguments
run_openssl req -x509 $ec -keyout "$work/ca.key" -out "$work/ca.pem" -days 3650 -subj /CN=sparseps-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
for role in server client; do
    usage=$([ "$role" = server ] && echo serverAuth || echo clientAuth)
    # shellcheck disable=SC2086
    run_openssl req $ec -keyout "$work/$role.key" -out "$work/$role.csr" -subj "/CN=sparseps-$role"
    { [ "$role" = server ] && echo "subjectAltName=$san"; echo "extendedKeyUsage=$usage"; } > "$work/$role.ext"
    run_openssl x509 -req -in "$work/$role.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
        -CAserial "$work/ca.srl" -out "$work/$role.pem" -days 825 -extfile "$work/$role.ext"
done
run_openssl rand -hex -out "$work/token" 32
chmod 0644 "$work/ca.pem" "$work/server.pem" "$work/client.pem"
# the token last: a run cut short while moving leaves a partial set, which the next run refuses, naming it
mv "$work/ca.pem" "$work/server.pem" "$work/server.key" "$work/client.pem" "$work/client.key" .
mv "$work/token" .
echo "sparseps secrets written to $dir (server certificate for $san)"
