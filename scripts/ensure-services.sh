#!/usr/bin/env bash
# Makes sure the Redis and MySQL that the tests use answer. If one does not
# and its server is installed, starts it on loopback; otherwise says exactly
# what to do. Honours TEST_REDIS_URL (redis://host:port[/db]) and
# TEST_MYSQL_DSN (go-sql-driver form, user@tcp(host:port)/db).
set -uo pipefail

redis_url=${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
hostport=${redis_url#redis://}; hostport=${hostport#*@}; hostport=${hostport%%/*}
redis_host=${hostport%:*}; redis_port=${hostport##*:}
[ "$redis_port" = "$hostport" ] && redis_port=6379

mysql_dsn=${TEST_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test}
mysql_addr=$(sed -n 's/.*tcp(\([^)]*\)).*/\1/p' <<<"$mysql_dsn")
mysql_host=${mysql_addr%:*}; mysql_port=${mysql_addr##*:}
mysql_db=${mysql_dsn##*/}; mysql_db=${mysql_db%%\?*}

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

redis_ok() {
	if command -v redis-cli >/dev/null; then
		[ "$(redis-cli -h "$redis_host" -p "$redis_port" ping 2>/dev/null)" = PONG ]
	else
		tcp_open "$redis_host" "$redis_port"
	fi
}

mysql_ok() {
	if command -v mysqladmin >/dev/null; then
		mysqladmin -h "$mysql_host" -P "$mysql_port" -uroot --protocol=tcp ping >/dev/null 2>&1
	else
		tcp_open "$mysql_host" "$mysql_port"
	fi
}

wait_for() { # name check
	for _ in $(seq 1 50); do "$2" && return 0; sleep 0.2; done
	return 1
}

fail=0
if redis_ok; then
	echo "redis: $redis_host:$redis_port answers"
elif command -v redis-server >/dev/null; then
	echo "redis: not answering on $redis_host:$redis_port; starting redis-server (no persistence, loopback only)"
	mkdir -p /tmp/delayd-redis
	redis-server --daemonize yes --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
		--dir /tmp/delayd-redis --logfile /tmp/delayd-redis/redis.log
	if wait_for redis redis_ok; then echo "redis: started"; else echo "redis: failed to start; see /tmp/delayd-redis/redis.log"; fail=1; fi
else
	echo "redis: nothing answers on $redis_host:$redis_port and redis-server is not installed."
	echo "       Install it:  sudo apt-get install -y redis-server   (or set TEST_REDIS_URL to a Redis 7 you have)"
	fail=1
fi

# The fault tests start redis-servers of their own (to kill, pause, restart
# and promote them), so redis-server must be installed even when
# TEST_REDIS_URL names a Redis elsewhere.
if ! command -v redis-server >/dev/null; then
	echo "redis-server: not installed; the fault tests start their own."
	echo "       Install it:  sudo apt-get install -y redis-server"
	fail=1
fi

if mysql_ok; then
	echo "mysql: $mysql_host:$mysql_port answers"
elif command -v mariadbd >/dev/null || command -v mysqld >/dev/null; then
	echo "mysql: not answering on $mysql_host:$mysql_port; starting the installed server"
	daemon=$(command -v mariadbd || command -v mysqld)
	if command -v start-stop-daemon >/dev/null; then
		start-stop-daemon --start --oknodo --background --exec "$daemon"
	else
		"$daemon" --user=root >/tmp/delayd-mysqld.log 2>&1 &
	fi
	if wait_for mysql mysql_ok; then echo "mysql: started"; else echo "mysql: failed to start"; fail=1; fi
else
	echo "mysql: nothing answers on $mysql_host:$mysql_port and no MySQL/MariaDB server is installed."
	echo "       Install it:  sudo apt-get install -y mariadb-server   (or set TEST_MYSQL_DSN to a MySQL 8 / MariaDB 10.11 you have)"
	fail=1
fi

if [ "$fail" = 0 ] && command -v mysql >/dev/null; then
	mysql -h "$mysql_host" -P "$mysql_port" -uroot --protocol=tcp -e "CREATE DATABASE IF NOT EXISTS \`$mysql_db\`" 2>/dev/null || true
fi
exit "$fail"
