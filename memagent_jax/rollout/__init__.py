"""The agent runtime: the agent contract (`agent_api`), the runner on the engine, the server
policy (`client`), conversations into training tokens, answers, chat helpers and `run`."""
