package reconciler

// The reconciler's own SQL, in one place. Writes to the operations and
// events tables go through store.Append/AppendTx only; these statements
// lock, find and deduplicate around them. Tables: migration
// 0003_reconciler.sql.

// sqlTryLeaderLock takes the sweeper lock if it is free.
const sqlTryLeaderLock = `SELECT pg_try_advisory_lock($1)`

// sqlLockLease locks the head row of an operation still at the expected seq
// and reads the lease column the executor's heartbeats renew.
const sqlLockLease = `SELECT lease_until FROM operations
	WHERE operation_key = $1 AND seq = $2 AND status = 'in_progress'
	FOR UPDATE`

// sqlRecordDelivery records a webhook id; no row comes back for a duplicate.
const sqlRecordDelivery = `INSERT INTO webhook_deliveries (source, webhook_id, received_at)
	VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`

// sqlLockByKey locks the operations among the candidate keys of a callback's
// idempotency key, so the callback's append cannot race another writer
// inside the transaction. Tombstones (pruned operations) have nothing a
// callback could change.
const sqlLockByKey = `SELECT operation_key FROM operations
	WHERE operation_key = ANY($1) AND tool = $2 AND pruned_at IS NULL
	ORDER BY operation_key
	FOR UPDATE`

// sqlLockByDownstreamID finds and locks the operation a tool knows by its
// own id (index operations_downstream_id).
const sqlLockByDownstreamID = `SELECT operation_key FROM operations
	WHERE tool = $1 AND record->>'downstream_id' = $2
	FOR UPDATE`

// sqlTraceparentTx is store.Traceparent inside the callback's transaction.
const sqlTraceparentTx = `SELECT traceparent FROM events WHERE operation_key = $1 AND seq = 1`

// sqlPruneDeliveries forgets webhook ids past the retention.
const sqlPruneDeliveries = `DELETE FROM webhook_deliveries WHERE received_at < $1`
