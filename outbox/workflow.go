package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/effectline/effectline/events"
	"github.com/effectline/effectline/workflow"
)

// StartWorkflow starts a declared workflow inside tx, the agent service's
// own transaction: the run and its first step's intent exist if and only if
// tx commits, like an intent of Append. The same workflow id with the same
// input returns the recorded run with started false; with another input the
// error wraps workflow.ErrPayloadConflict. Neither writes anything or
// aborts tx.
func StartWorkflow(ctx context.Context, tx pgx.Tx, svc *workflow.Service, in workflow.Start) (rec events.Workflow, started bool, err error) {
	return svc.StartTx(ctx, tx, in)
}
