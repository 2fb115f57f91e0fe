#!/bin/sh
# Makes the secrets a sparseps cluster runs with (docs/security.md), in DIR:
#   token                  the shared token every gRPC call and every metrics scrape carries (64 hex digits)
#   ca.pem                 a private CA's certificate: clients verify the servers with it
#   server.pem server.key  the servers' certificate, naming every NAME given, localhost and 127.0.0.1 (a NAME
#                          that is an IPv4 or IPv6 address as an address: TLS clients match an address
#                          against the certificate's IP names only)
#   client.pem client.key  a client certificate, for servers started with --tls-ca ca.pem (mutual TLS)
# The CA's key is not kept: no other certificate can be issued under this CA. Secrets already in DIR are kept
# (a restart keeps them), unless a certificate there has expired (exit 1, naming it); to add a server name, or to
# renew, remove DIR and run this again, then restart every pod.
#   deploy/gen-secrets.sh DIR NAME...                                      needs the openssl command
#   deploy/gen-secrets.sh /secrets ps-0 ps-1                               (docker-compose.yml's secrets job)
#   deploy/gen-secrets.sh ./secrets sparseps-0.sparseps sparseps-1.sparseps \
#     sparseps-0.sparseps.NAMESPACE.svc sparseps-1.sparseps.NAMESPACE.svc \
#     && kubectl create secret generic sparseps-secrets --from-file=./secrets   (deploy/k8s)
set -eu
# The subjectAltName entry of a NAME: IP:ADDRESS for an IPv4 address (four dot-separated numbers) or an IPv6 one
# (a colon, which no host name holds), else DNS:NAME.
san_of() {
    case $1 in
        *:*) echo "IP:$1" ;;
        *[!0-9.]* | *..* | .* | *. | *.*.*.*.*) echo "DNS:$1" ;;
        *.*.*.*) echo "IP:$1" ;;
        *) echo "DNS:$1" ;;
    esac
}
[ $# -ge 1 ] || { echo "usage: $0 DIR [SERVER-NAME...]" >&2; exit 2; }
dir=$1
shift
umask 077
mkdir -p "$dir"
cd "$dir"
if [ -s token ] && [ -s server.pem ] && [ -s server.key ] && [ -s ca.pem ]; then
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
for f in token server.pem server.key ca.pem; do
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
san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    entry=$(san_of "$name")
    case ",$san," in *",$entry,"*) ;; *) san="$san,$entry" ;; esac  # each name once
done
# shellcheck disable=SC2086  # $ec is several arguments
openssl req -x509 $ec -keyout "$work/ca.key" -out ca.pem -days 3650 -subj /CN=sparseps-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
for role in server client; do
    usage=$([ "$role" = server ] && echo serverAuth || echo clientAuth)
    # shellcheck disable=SC2086
    openssl req $ec -keyout "$role.key" -out "$work/$role.csr" -subj "/CN=sparseps-$role" 2>/dev/null
    { [ "$role" = server ] && echo "subjectAltName=$san"; echo "extendedKeyUsage=$usage"; } > "$work/$role.ext"
    openssl x509 -req -in "$work/$role.csr" -CA ca.pem -CAkey "$work/ca.key" -CAcreateserial \
        -CAserial "$work/ca.srl" -out "$role.pem" -days 825 -extfile "$work/$role.ext" 2>/dev/null
done
openssl rand -hex 32 > token
chmod 0644 ca.pem server.pem client.pem
echo "sparseps secrets written to $dir (server certificate for $san)"
