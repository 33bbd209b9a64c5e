"""The synthetic-task experiment: a memory agent trained from scratch (`memagent-tiny`).

Above the core, which imports nothing from here: the tasks and their documents (tasks.py, the
`data synthetic` command), oracle trajectories and the warm-up's extra rows (oracle.py,
rows.py), carry starts (carry_starts.py), the plugin the trainer loads from a config's
`plugin` section (plugin.py), and the commands that read with a trained agent: `demo`, `trace`
(demo.py, trace.py, carries.py); command.py registers `demo`, `trace` and `data synthetic`
with the CLI. The recipe: configs/synthetic/; its design and results: docs/synthetic.md.
"""
