-- Reverts 0001_init: drops every delayd table and the data in it. delayd
-- never runs down migrations itself; this is for an operator removing
-- delayd from a database on purpose.
DROP TABLE IF EXISTS delayd_api_keys;
DROP TABLE IF EXISTS delayd_namespaces;
DROP TABLE IF EXISTS delayd_task_history;
DROP TABLE IF EXISTS delayd_tasks;
