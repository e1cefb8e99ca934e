"""Katib for chexflow, room by room (ARCHITECTURE.md draws the order of imports):

- experiment/   the Experiment model (model.py), the spec reader with Katib's defaults and
                webhook rules (spec.py, fields.py, batchjob.py; yamltext.py reads every YAML
                text, refusing a key given twice), trial templates (templates.py: ConfigMap
                templates, trialspec.py: trialSpec -> a local command, chexnet_template.py:
                katib/trial-templates.yaml from the jobs renderer)
- suggestions/  one table of algorithms (algorithms.py: algorithm -> Katib's service -> the
                suggester here), each service's settings rules (validation.py), the shared
                search space and base, one module per library (hyperopt, optuna, skopt, cmaes)
- earlystopping/ medianstop, Katib's semantics
- local/        the local runner (`chexflow tune`): runner, state, metrics collectors and
                tfevents, collector paths, results (also written for a cluster's Experiment)
- cluster/      the cluster client (`chexflow tune --cluster`): create, follow, read
- services/     Katib's Suggestion and EarlyStopping gRPC services with the same code
- commands.py   the CLI: `chexflow tune`, `chexflow katib-suggestion|katib-earlystopping`
"""
