"""The run side: expand a sweep into cases (`plan`), run them and write shards (`runner`, `caserun`, `groups`:
cases timed beside their BF16 twin), hand jobs to GPUs (`launch`) and summarise a run (`summary`)."""
