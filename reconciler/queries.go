package reconciler

// The reconciler's own SQL, in one place: the statements on its own tables
// (migration 0003_reconciler.sql) and its advisory lock. The operations and
// events tables are the store's: the reconciler reads, locks and appends to
// them through store methods only.

// sqlTryLeaderLock takes the sweeper lock if it is free.
const sqlTryLeaderLock = `SELECT pg_try_advisory_lock($1)`

// sqlRecordDelivery records a webhook id; no row comes back for a duplicate.
const sqlRecordDelivery = `INSERT INTO webhook_deliveries (source, webhook_id, received_at)
	VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`

// sqlPruneDeliveries forgets webhook ids past the retention.
const sqlPruneDeliveries = `DELETE FROM webhook_deliveries WHERE received_at < $1`
