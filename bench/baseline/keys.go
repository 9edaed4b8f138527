package baseline

// Keys of one baseline queue. Every key of a queue shares the hash tag
// {prefix:queue}, so the scripts' keys sit in one Redis Cluster slot, as
// delayd's do. The source designs use fixed names such as
// "borrow:due:zset"; the benchmark needs a fresh prefix per run so that it
// never touches anyone else's keys and can clean up after itself.
//
//	delaybench:{<prefix>:<queue>}:zset   ZSET  task id -> due time (Unix ms)
//	delaybench:{<prefix>:<queue>}:hash   HASH  task id -> task record (payload)
type keys struct {
	zset string
	hash string
}

// queueKeys returns the keys of queue under prefix.
func queueKeys(prefix, queue string) keys {
	tag := "delaybench:{" + prefix + ":" + queue + "}:"
	return keys{zset: tag + "zset", hash: tag + "hash"}
}

// Pattern returns a SCAN MATCH pattern covering every key of every queue
// under prefix.
func Pattern(prefix string) string { return "delaybench:{" + prefix + ":*" }
