"""One job over many processes (a TPU pod's hosts, a GPU cluster's nodes), one module a job:

- `startup`: joining the job (`start`, its flags `add_flags` and `launch_from_flags`, the
  processes' `check_agreement`, `joined`), JAX's CPU backend set up before JAX starts
  (`reserve_cpu_threads`, `cpu_where_no_accelerator`), and the one read of JAX's private
  distributed state (`coordination_client`);
- `collectives`: the host-side collectives that keep the processes in agreement (`is_main`,
  `to_host`, `gather`, `broadcast`, `check_same`, `on_main`, `check_shared_directory`);
- `preemption`: `PreemptionNotice`, a stop (SIGTERM, Ctrl-C) every process takes at the same
  point.

A docstring only: code imports from the module that owns a name. At import the modules load
only the standard library, one another and `memagent_jax.errors` (JAX loads inside the
functions), so that the command modules and `import memagent_jax` may import them.
"""
