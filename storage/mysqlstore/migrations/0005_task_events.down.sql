DROP TABLE IF EXISTS delayd_task_events;
