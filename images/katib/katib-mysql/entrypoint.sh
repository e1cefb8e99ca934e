#!/bin/bash
# katib-mysql's entrypoint: MariaDB for katib-db-manager, configured from the environment as
# Katib's manifest configures mysql:8.
#   MYSQL_ROOT_PASSWORD         root's password (root@localhost and root@'%')
#   MYSQL_ALLOW_EMPTY_PASSWORD  true|yes|1: an empty password is allowed
#   MYSQL_DATABASE              a database to create (Katib's: katib)
# Arguments go to mariadbd after chexflow's (--datadir DIR or --datadir=DIR picks the datadir,
# default /var/lib/mysql). The first start in an empty datadir runs mariadb-install-db; every
# start applies the password and database (idempotent SQL in an --init-file).
set -euo pipefail

datadir=/var/lib/mysql
args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    --datadir=*) datadir="${args[$i]#--datadir=}" ;;
    --datadir) datadir="${args[$((i + 1))]:-}" ;;
  esac
done
[ -n "$datadir" ] || { echo "katib-mysql: --datadir needs a directory" >&2; exit 2; }

password="${MYSQL_ROOT_PASSWORD:-}"
case "${MYSQL_ALLOW_EMPTY_PASSWORD:-}" in true | yes | 1) allow_empty=1 ;; *) allow_empty= ;; esac
if [ -z "$password" ] && [ -z "$allow_empty" ]; then
  echo "katib-mysql: MYSQL_ROOT_PASSWORD is empty: set it (or MYSQL_ALLOW_EMPTY_PASSWORD=true)" >&2
  exit 2
fi

as_mysql=()
if [ "$(id -u)" = 0 ]; then  # root: mariadbd drops to the mysql user itself
  as_mysql=(--user=mysql)
  mkdir -p "$datadir"
  chown mysql:mysql "$datadir" /run/mysqld
fi

if [ ! -d "$datadir/mysql" ]; then
  echo "katib-mysql: initialising $datadir" >&2
  mkdir -p "$datadir"
  # socket: the only root account is root@localhost (no passwordless root@127.0.0.1 or @host)
  if ! log="$(mariadb-install-db "${as_mysql[@]}" --datadir="$datadir" --skip-test-db \
      --auth-root-authentication-method=socket --skip-name-resolve 2>&1)"; then
    echo "$log" >&2
    echo "katib-mysql: mariadb-install-db failed in $datadir" >&2
    exit 1
  fi
fi

sql_string() {  # a single-quoted SQL string literal
  local s="${1//\\/\\\\}"
  printf "'%s'" "${s//\'/\\\'}"
}
pw="$(sql_string "$password")"
init="$(mktemp /tmp/katib-mysql-init.XXXXXX)"
{
  echo "CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY $pw;"
  echo "ALTER USER 'root'@'%' IDENTIFIED BY $pw;"
  echo "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;"
  echo "ALTER USER 'root'@'localhost' IDENTIFIED BY $pw;"
  if [ -n "${MYSQL_DATABASE:-}" ]; then
    echo "CREATE DATABASE IF NOT EXISTS \`${MYSQL_DATABASE//\`/\`\`}\`;"
  fi
  echo "FLUSH PRIVILEGES;"
} > "$init"
[ ${#as_mysql[@]} -eq 0 ] || chown mysql:mysql "$init"

exec mariadbd "${as_mysql[@]}" --datadir="$datadir" --port=3306 --bind-address=0.0.0.0 \
  --skip-name-resolve --init-file="$init" "$@"
