"""An index for "surfaced by a supervisor" (``approvals.selectors.surfaced_by_a_supervisor``): the inbox and
thread pages leave out the sub-agent calls that a supervisor's open call surfaces, a check that scanned every
call of the table on each read; the index holds only the open supervisors' calls."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0020_listing_items"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="suspendedtoolcall",
            index=models.Index(
                condition=models.Q(("inner_run_id__isnull", False), ("status", "open")),
                fields=["inner_run_id", "inner_tool_call_id"],
                name="suspended_call_surfacing",
            ),
        ),
    ]
